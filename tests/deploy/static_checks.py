"""deploy_test.sh's checks that need no running process: the rendered
Kubernetes manifests (schemas and structure), the Compose file, the
Dockerfiles, and every flatshard and kubectl command written in deploy/ and
docs/deploy.md against the programs' --help.

    static_checks.py SOURCE_DIR RUN_DIR BIN_DIR

RUN_DIR holds k8s-{base,cpu,gpu}.yaml (kubectl kustomize's output; a missing
one is skipped). BIN_DIR is "" when flatshard is not built: the flag checks
are then skipped. Prints PASS:/FAIL:/SKIP: lines; exits 1 if any check failed.
"""
import fnmatch
import glob
import math
import os
import re
import subprocess
import sys

import yaml

from docs_commands import code_text, documented_secrets, logical_lines

SRC, RUN, BIN = sys.argv[1], sys.argv[2], sys.argv[3]
failures = 0


def check(name):
    """Runs the decorated function at once: PASS unless it raises."""
    def run(fn):
        global failures
        try:
            fn()
            print(f"PASS: {name}")
        except AssertionError as e:
            failures += 1
            print(f"FAIL: {name}: {e}")
        except Exception as e:  # a checker bug fails the check, visibly
            failures += 1
            print(f"FAIL: {name}: {type(e).__name__}: {e}")
    return run


def skip(name, why):
    print(f"SKIP: {name}: {why}")


def read(path):
    with open(os.path.join(SRC, path)) as f:
        return f.read()


# ---------------------------------------------------------------- Kubernetes

rendered = {}
for variant in ("base", "cpu", "gpu"):
    path = os.path.join(RUN, f"k8s-{variant}.yaml")
    if os.path.exists(path):
        with open(path) as f:
            rendered[variant] = [d for d in yaml.safe_load_all(f) if d]


def objects(docs, kind):
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def pod_templates(docs):
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet"):
            yield d["metadata"]["name"], d["spec"]["template"]


def container(docs, kind, name, container_name):
    workload = objects(docs, kind)[name]
    for c in workload["spec"]["template"]["spec"]["containers"]:
        if c["name"] == container_name:
            return workload, c
    raise AssertionError(f"{kind}/{name} has no container {container_name}")


def flag_value(c, flag):
    for a in c.get("command", []) + c.get("args", []):
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    raise AssertionError(f"container {c['name']} has no {flag}=")


def mount_of(pod_spec, c, path):
    """The volume mounted at the longest mountPath that is a prefix of path."""
    best = None
    for m in c.get("volumeMounts", []):
        mp = m["mountPath"].rstrip("/")
        if (path == mp or path.startswith(mp + "/")) and (best is None or len(mp) > len(best[0])):
            best = (mp, m["name"])
    assert best, f"{path} is on no volume of container {c['name']}"
    for v in pod_spec.get("volumes", []):
        if v["name"] == best[1]:
            return v
    raise AssertionError(f"volume {best[1]} is not declared")


try:
    import kubernetes_validate
except ImportError:
    kubernetes_validate = None

for variant, docs in rendered.items():
    if kubernetes_validate is None:
        skip(f"k8s {variant}: schemas", "kubernetes-validate is not installed (no venv)")
    else:
        for version in ("1.28.0", kubernetes_validate.latest_version()):
            @check(f"k8s {variant}: every object valid against the Kubernetes {version} schema "
                   "(strict; the PodMonitor CRD is checked structurally below)")
            def _():
                errors = []
                for d in docs:
                    if d["apiVersion"].startswith("monitoring.coreos.com/"):
                        continue
                    try:
                        kubernetes_validate.validate(d, version, strict=True)
                    except kubernetes_validate.ValidationError as e:
                        errors.append(f"{d['kind']}/{d['metadata']['name']} at "
                                      f"{'.'.join(map(str, e.path))}: {e.message}")
                assert not errors, "; ".join(errors)

    @check(f"k8s {variant}: PodMonitor selects both daemons' pods, on a named metrics port, "
           "job label from app.kubernetes.io/name, known fields only")
    def _():
        monitors = objects(docs, "PodMonitor")
        assert list(monitors) == ["flatshard"], f"PodMonitors: {list(monitors)}"
        m = monitors["flatshard"]
        assert m["apiVersion"] == "monitoring.coreos.com/v1", m["apiVersion"]
        spec = m["spec"]
        unknown = set(spec) - {"jobLabel", "selector", "podMetricsEndpoints", "namespaceSelector",
                               "podTargetLabels", "sampleLimit", "targetLimit"}
        assert not unknown, f"unknown PodMonitor fields {unknown}"
        assert spec["jobLabel"] == "app.kubernetes.io/name", spec["jobLabel"]
        endpoints = spec["podMetricsEndpoints"]
        for e in endpoints:
            unknown = set(e) - {"port", "path", "interval", "scrapeTimeout", "scheme",
                                "relabelings", "metricRelabelings", "honorLabels"}
            assert not unknown, f"unknown podMetricsEndpoints fields {unknown}"
        selected = set()
        for name, template in pod_templates(docs):
            labels = template["metadata"]["labels"]
            ok = all(labels.get(k) == v for k, v in spec["selector"].get("matchLabels", {}).items())
            for expr in spec["selector"].get("matchExpressions", []):
                assert expr["operator"] == "In", expr
                ok = ok and labels.get(expr["key"]) in expr["values"]
            if not ok:
                continue
            selected.add(name)
            assert labels.get("app.kubernetes.io/name") == name, (name, labels)
            ports = {p["name"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
            for e in endpoints:
                assert e["port"] in ports, f"{name} has no port named {e['port']}"
        assert selected == {"flatshard-coordinator", "flatshard-worker"}, selected

    @check(f"k8s {variant}: workers are a Parallel StatefulSet on a headless Service, "
           "rank and id from the pod (pod-index label, pod name)")
    def _():
        sts, c = container(docs, "StatefulSet", "flatshard-worker", "worker")
        assert sts["spec"].get("podManagementPolicy") == "Parallel", sts["spec"].get("podManagementPolicy")
        svc = objects(docs, "Service")[sts["spec"]["serviceName"]]
        assert svc["spec"].get("clusterIP") == "None", "the workers' Service must be headless"
        assert svc["spec"].get("publishNotReadyAddresses") is True, \
            "worker DNS names must resolve before the pods are ready"
        labels = sts["spec"]["template"]["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in svc["spec"]["selector"].items())
        env = {e["name"]: e for e in c["env"]}
        assert env["POD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == \
            "metadata.labels['apps.kubernetes.io/pod-index']", env["POD_INDEX"]
        assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        assert flag_value(c, "--rank") == "$(POD_INDEX)"
        assert flag_value(c, "--worker-id") == "$(POD_NAME)"
        # The id's secret survives a restart of the container (readOnlyRootFilesystem).
        seats = mount_of(sts["spec"]["template"]["spec"], c, flag_value(c, "--state-dir"))
        assert "emptyDir" in seats, seats
        host = flag_value(c, "--advertise-host")
        assert host == f"$(POD_NAME).{svc['metadata']['name']}.$(POD_NAMESPACE).svc", host

    @check(f"k8s {variant}: coordinator is one Recreate replica with --state-dir on a "
           "ReadWriteOnce claim; coordinator and workers share a ReadWriteMany checkpoint claim "
           "at the paths their flags name")
    def _():
        dep, c = container(docs, "Deployment", "flatshard-coordinator", "coordinator")
        assert dep["spec"]["replicas"] == 1, dep["spec"]["replicas"]
        assert dep["spec"]["strategy"]["type"] == "Recreate", dep["spec"]["strategy"]
        pvcs = objects(docs, "PersistentVolumeClaim")
        pod = dep["spec"]["template"]["spec"]
        state = mount_of(pod, c, flag_value(c, "--state-dir"))
        assert pvcs[state["persistentVolumeClaim"]["claimName"]]["spec"]["accessModes"] == \
            ["ReadWriteOnce"]
        claims = set()
        for kind, name, cname, flag in (("Deployment", "flatshard-coordinator", "coordinator",
                                         "--checkpoint-root"),
                                        ("StatefulSet", "flatshard-worker", "worker",
                                         "--checkpoint-dir")):
            w, wc = container(docs, kind, name, cname)
            v = mount_of(w["spec"]["template"]["spec"], wc, flag_value(wc, flag))
            assert "persistentVolumeClaim" in v, f"{name}'s {flag} is not on a claim"
            claims.add(v["persistentVolumeClaim"]["claimName"])
        assert len(claims) == 1, f"checkpoints on different claims {claims}"
        claim = pvcs[claims.pop()]
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"], claim["spec"]["accessModes"]

    @check(f"k8s {variant}: every pod non-root, no privilege escalation, read-only root, "
           "resource requests, probes that are not kubelet gRPC probes under TLS")
    def _():
        for name, template in pod_templates(docs):
            spec = template["spec"]
            sc = spec.get("securityContext", {})
            assert sc.get("runAsNonRoot") is True and sc.get("runAsUser", 0) != 0, (name, sc)
            for c in spec["containers"]:
                csc = c.get("securityContext", {})
                assert csc.get("allowPrivilegeEscalation") is False, (name, csc)
                assert csc.get("readOnlyRootFilesystem") is True, (name, csc)
                assert {"cpu", "memory"} <= set(c["resources"]["requests"]), (name, c["resources"])
                tls = any(e["name"] == "FLATSHARD_TLS_CA" for e in c.get("env", []))
                for probe in ("readinessProbe", "livenessProbe"):
                    assert probe in c, f"{name} has no {probe}"
                    assert not (tls and "grpc" in c[probe]), \
                        f"{name}: a kubelet grpc probe cannot pass mutual TLS"

    @check(f"k8s {variant}: every $(VAR) in a command is defined in its container's env")
    def _():
        for name, template in pod_templates(docs):
            for c in template["spec"]["containers"]:
                defined = {e["name"] for e in c.get("env", [])}
                for a in c.get("command", []) + c.get("args", []):
                    for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", a):
                        assert var in defined, f"{name}: $({var}) in '{a}' is not in env"

    @check(f"k8s {variant}: the workers' preStop hook is a mounted ConfigMap key")
    def _():
        sts, c = container(docs, "StatefulSet", "flatshard-worker", "worker")
        cmd = c["lifecycle"]["preStop"]["exec"]["command"]
        script = next(a for a in cmd if a.endswith(".sh"))
        v = mount_of(sts["spec"]["template"]["spec"], c, script)
        cm = objects(docs, "ConfigMap")[v["configMap"]["name"]]
        assert os.path.basename(script) in cm["data"], (script, list(cm["data"]))
        assert sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 540, \
            "too short for the hook's FLATSHARD_SAVE_TIMEOUT (540 s)"

    gpu_wanted = variant == "gpu"

    @check(f"k8s {variant}: " + ("workers request nvidia.com/gpu: 1 and --device cuda, on the "
                                 "CUDA image" if gpu_wanted else
                                 "no GPU requested, --device cpu"))
    def _():
        sts, c = container(docs, "StatefulSet", "flatshard-worker", "worker")
        env = {e["name"]: e.get("value") for e in c["env"]}
        limits = c["resources"].get("limits", {})
        requests = c["resources"].get("requests", {})
        if gpu_wanted:
            assert str(limits.get("nvidia.com/gpu")) == "1", limits
            assert str(requests.get("nvidia.com/gpu", 1)) == "1", requests
            assert env["FLATSHARD_DEVICE"] == "cuda", env["FLATSHARD_DEVICE"]
            assert "flatshard-cuda" in c["image"], c["image"]
            assert any(v.get("emptyDir", {}).get("medium") == "Memory"
                       for v in sts["spec"]["template"]["spec"]["volumes"]), "no /dev/shm for NCCL"
        else:
            assert "nvidia.com/gpu" not in limits and "nvidia.com/gpu" not in requests
            assert env["FLATSHARD_DEVICE"] == "cpu", env["FLATSHARD_DEVICE"]
        if variant == "cpu":
            assert "flatshard-cpu" in c["image"], c["image"]

    @check(f"k8s {variant}: every Secret key the pods read is made by docs/deploy.md's "
           "`kubectl create secret` commands")
    def _():
        made = documented_secrets(read("docs/deploy.md"))
        hook = read("deploy/k8s/base/save-before-stop.sh")
        for name, template in pod_templates(docs):
            spec = template["spec"]
            for c in spec["containers"]:
                texts = [e.get("value", "") for e in c.get("env", [])] + \
                    c.get("command", []) + c.get("args", []) + [hook]
                for m in c.get("volumeMounts", []):
                    vol = next(v for v in spec["volumes"] if v["name"] == m["name"])
                    if "secret" not in vol:
                        continue
                    secret = vol["secret"]["secretName"]
                    mp = re.escape(m["mountPath"].rstrip("/"))
                    keys = {k for t in texts for k in re.findall(mp + r"\}?/([\w.-]+)", t)}
                    assert keys, f"{name}: nothing reads the Secret {secret}"
                    assert secret in made, f"docs/deploy.md creates no Secret {secret}"
                    missing = keys - set(made[secret])
                    assert not missing, f"docs/deploy.md's {secret} lacks {sorted(missing)}"


# ------------------------------------------------------------------- Compose

compose_dir = os.path.join(SRC, "deploy/docker")
compose = yaml.safe_load(read("deploy/docker/compose.yaml"))
services = compose["services"]
workers = {n: s for n, s in services.items() if re.fullmatch(r"worker-\d+", n)}


@check("compose: every bind-mounted file exists, the build's Dockerfile too")
def _():
    for name, s in services.items():
        for v in s.get("volumes", []):
            source = v.split(":")[0]
            if source.startswith("."):
                path = os.path.normpath(os.path.join(compose_dir, source))
                assert os.path.exists(path), f"{name}: {source} does not exist"
        if "build" in s:
            b = s["build"]
            context = os.path.normpath(os.path.join(compose_dir, b["context"]))
            assert os.path.isfile(os.path.join(context, b["dockerfile"])), b


@check("compose: workers are worker-0..N-1 with ranks 0..N-1, each in the certificates' hosts "
       "and Prometheus's targets, dialing the coordinator service")
def _():
    assert len(workers) >= 2, list(workers)
    hosts = services["certs"]["environment"]["FLATSHARD_CERT_HOSTS"].split(",")
    assert "coordinator" in hosts, hosts
    ranks = set()
    for name, s in workers.items():
        env = s["environment"]
        assert env["WORKER"] == name, (name, env["WORKER"])
        ranks.add(int(env["RANK"]))
        assert name in hosts, f"{name} is not in FLATSHARD_CERT_HOSTS"
        assert env["FLATSHARD_COORDINATOR"].split(":")[0] in services, env["FLATSHARD_COORDINATOR"]
    assert ranks == set(range(len(workers))), sorted(ranks)
    prom = yaml.safe_load(read("deploy/docker/prometheus.yml"))
    jobs = {j["job_name"]: [t for sc in j["static_configs"] for t in sc["targets"]]
            for j in prom["scrape_configs"]}
    assert sorted(jobs["flatshard-worker"]) == sorted(f"{w}:9400" for w in workers), jobs
    assert jobs["flatshard-coordinator"] == ["coordinator:9400"], jobs
    rules = yaml.safe_load(read("deploy/prometheus/flatshard-rules.yml"))
    exprs = " ".join(r.get("expr", "") for g in rules["groups"] for r in g["rules"])
    for job in jobs:
        assert job in exprs or job == "flatshard-coordinator", \
            f"the rules do not know the scrape job {job}"


@check("compose: the flatshard image pre-creates every volume mount point under "
       "/var/lib/flatshard (a named volume then belongs to its non-root user)")
def _():
    for dockerfile in ("Dockerfile.cpu", "Dockerfile.cuda"):
        text = read(f"deploy/docker/{dockerfile}")
        made = set(re.findall(r"(/var/lib/flatshard[\w/.-]*)", text))
        for name, s in services.items():
            if s.get("image") != services["coordinator"]["image"]:
                continue
            for v in s.get("volumes", []):
                source, target = v.split(":")[:2]
                if not source.startswith(".") and target.startswith("/var/lib/flatshard"):
                    assert target in made, f"{dockerfile} does not create {target} ({name})"


@check("compose: the coordinator depends on every worker, so that `docker compose stop` stops "
       "it first (workers stopped under it would end the job FAILED)")
def _():
    needs = services["coordinator"].get("depends_on", {})
    missing = set(workers) - set(needs)
    assert not missing, f"the coordinator does not depend on {sorted(missing)}"
    for name in workers:
        assert "coordinator" not in services[name].get("depends_on", {}), name


@check("systemd: workers are ordered before the coordinator (stopped after it), the "
       "save-on-stop unit after both (stopped, and saving, first)")
def _():
    def ordering(unit, key):
        text = read(f"deploy/systemd/{unit}")
        return {u for line in re.findall(rf"^{key}=(.*)$", text, re.M) for u in line.split()}
    assert "flatshard-coordinator.service" in ordering("flatshard-worker@.service", "Before")
    assert "flatshard-save-on-stop.service" in ordering("flatshard-worker@.service", "Before")
    assert "flatshard-coordinator.service" in ordering("flatshard-save-on-stop.service", "After")
    assert "flatshard-coordinator.service" not in ordering("flatshard-worker@.service", "After")


@check("compose: the Grafana datasource has the uid the repository's provisioning uses")
def _():
    ours = yaml.safe_load(read("deploy/docker/grafana/datasource.yml"))["datasources"]
    theirs = yaml.safe_load(read("dashboards/provisioning/datasources/flatshard.yml"))["datasources"]
    assert [d["uid"] for d in ours] == [d["uid"] for d in theirs], (ours, theirs)


# --------------------------------------------------------------- Dockerfiles

def dockerignored(path, patterns):
    ignored = False
    for p in patterns:
        negate = p.startswith("!")
        p = p.lstrip("!").strip("/")
        parts = path.split("/")
        hit = any(fnmatch.fnmatch("/".join(parts[:i]), p) for i in range(1, len(parts) + 1))
        if p.startswith("**/"):
            hit = hit or any(fnmatch.fnmatch(x, p[3:]) for x in parts)
        if hit:
            ignored = not negate
    return ignored


for dockerfile in ("Dockerfile.cpu", "Dockerfile.cuda"):
    @check(f"{dockerfile}: COPY sources exist and are not dockerignored; base images pinned; "
           "the runtime stage runs as a non-root uid")
    def _():
        text = read(f"deploy/docker/{dockerfile}")
        ignore = [line.strip() for line in read(f"deploy/docker/{dockerfile}.dockerignore").split("\n")
                  if line.strip() and not line.startswith("#")]
        for m in re.finditer(r"^COPY (?!--from)(.+) (\S+)$", text, re.M):
            for source in m.group(1).split():
                if source == ".":
                    continue
                assert os.path.exists(os.path.join(SRC, source)), f"COPY {source}: not found"
                assert not dockerignored(source, ignore), f"COPY {source} is dockerignored"
        for needed in ("scripts/setup.sh", "CMakeLists.txt", "deploy/prometheus/flatshard-rules.yml",
                       "deploy/docker/runtime-packages.sh", "tests/CMakeLists.txt"):
            assert not dockerignored(needed, ignore), f"{needed} would be left out of the context"
        assert dockerignored("build/bin/flatshard", ignore) and dockerignored(".git/HEAD", ignore)
        args = dict(re.findall(r"^ARG (\w+)=(\S+)", text, re.M))
        for image in re.findall(r"^FROM (\S+)", text, re.M):
            image = re.sub(r"\$\{(\w+)\}", lambda v: args.get(v.group(1), v.group(0)), image)
            assert ":" in image and not image.endswith(":latest"), f"FROM {image} is not pinned"
        users = re.findall(r"^USER (\S+)", text, re.M)
        assert users and not users[-1].startswith("0") and users[-1][0].isdigit(), users


# ------------------------------------------------------------------ commands

helps = {}


def help_of(program, path):
    key = (program,) + tuple(path)
    if key not in helps:
        r = subprocess.run([os.path.join(BIN, program), *path, "--help"], capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 0, f"{' '.join(key)} --help exited {r.returncode}"
        text = r.stdout
        flags = {"-h", "--help"}
        for line in text.split("\n"):
            m = re.match(r"\s+(-[^\s]+)", line)
            if m:
                flags |= set(m.group(1).split(","))
        subs = set()
        if "Subcommands:" in text:
            for line in text.split("Subcommands:")[1].split("\n"):
                m = re.match(r"  ([a-z][\w-]*)\s", line)
                if m:
                    subs.add(m.group(1))
        helps[key] = (flags, subs, set(re.findall(r"Env:(\w+)", text)))
    return helps[key]


REDIRECT = re.compile(r"^\d*[<>]")
SEPARATORS = {";", "|", "||", "&&", "&", ")", "}", "do", "then"}


# Tokens after which a word is in command position.
COMMAND_POSITION = {";", "|", "||", "&&", "&", "exec", "then", "do", "cli", "command:",
                    "entrypoint:", "$(", "time", "nohup"}


def invocations(text, where):
    """(program, tokens after it, where) for every flatshard program run on a
    logical line: a word in command position, or a path to the program
    (.../bin/flatshard, $bin/flatshard; not a directory such as /opt/flatshard)."""
    out = []
    for n, line in logical_lines(text):
        tokens = line.split()
        for i, raw in enumerate(tokens):
            t = re.sub(r"^-?Exec\w+=-?", "", raw.strip("'\"[],`("))
            base = t.rsplit("/", 1)[-1]
            if base not in ("flatshard", "flatshard-coordinator", "flatshard-worker"):
                continue
            before = tokens[i - 1].strip("'\"[") if i else ""
            directory = t.rsplit("/", 1)[0] if "/" in t else None
            program_path = directory is not None and (directory.endswith("bin") or
                                                      directory.startswith("$"))
            if not (program_path or i == 0 or before in COMMAND_POSITION or
                    re.fullmatch(r"\w+=\S*", before) or raw.startswith(("`", "$("))):
                continue
            rest = []
            for r in tokens[i + 1:]:
                if r in SEPARATORS:
                    break
                rest.append(r)
            out.append((base, rest, f"{where}:{n}"))
    return out


def bad_flags(program, rest):
    path = []
    flags, subs, _ = help_of(program, path)
    tokens = [t.strip("'\"`;),]") for t in rest]
    skip_next = False
    bad = []
    for t in tokens:
        if skip_next:
            skip_next = False
            continue
        if REDIRECT.match(t):
            skip_next = t in (">", ">>", "<", "2>")
            continue
        if t in subs and not any(x.startswith("-") for x in tokens[:tokens.index(t)]):
            path.append(t)
            flags, subs, _ = help_of(program, path)
            continue
        m = re.match(r"^(--?[A-Za-z][\w-]*)", t)
        if m and m.group(1) not in flags:
            bad.append(m.group(1))
    return " ".join([program] + path), bad


def command_sources():
    """(text, where) of every file in deploy/ and docs/deploy.md's code, and the
    commands of the rendered manifests and the Compose file."""
    for path in sorted(glob.glob(os.path.join(SRC, "deploy/**/*"), recursive=True)):
        if os.path.isfile(path) and not path.endswith((".json",)):
            rel = os.path.relpath(path, SRC)
            yield read(rel), rel
    yield code_text(read("docs/deploy.md")), "docs/deploy.md"
    for variant, docs in rendered.items():
        for name, template in pod_templates(docs):
            for c in template["spec"]["containers"]:
                yield " ".join(c.get("command", []) + c.get("args", [])), f"k8s {variant} {name}"
    for name, s in services.items():
        cmd = s.get("command", [])
        yield (" ".join(cmd) if isinstance(cmd, list) else cmd).replace("$$", "$"), \
            f"compose {name}"


if not BIN:
    skip("commands: every flag exists", "flatshard is not built (no bin/ with the programs)")
else:
    @check("commands: every flatshard, flatshard-coordinator and flatshard-worker flag and "
           "subcommand in deploy/ and docs/deploy.md exists (--help)")
    def _():
        problems, seen = [], 0
        for text, where in command_sources():
            for program, rest, at in invocations(text, where):
                seen += 1
                command, bad = bad_flags(program, rest)
                if bad:
                    problems.append(f"{at}: {command} has no {', '.join(bad)}")
        assert seen >= 30, f"only {seen} invocations found: the scanner is broken"
        assert not problems, "; ".join(problems)

    @check("commands: every FLATSHARD_* variable set for a flatshard container is read by a "
           "flatshard program, its command or its hook")
    def _():
        read_by_programs = set()
        for key in list(helps):
            read_by_programs |= helps[key][2]
        for program in ("flatshard-coordinator", "flatshard-worker"):
            read_by_programs |= help_of(program, [])[2]
        hook = read("deploy/k8s/base/save-before-stop.sh") + read("deploy/docker/init-secrets.sh")
        problems = []
        envs = []
        for variant, docs in rendered.items():
            for name, template in pod_templates(docs):
                for c in template["spec"]["containers"]:
                    envs.append((f"k8s {variant} {name}", [e["name"] for e in c.get("env", [])],
                                 " ".join(c.get("command", []) + c.get("args", []))))
        for name, s in services.items():
            if "build" in s:
                cmd = s.get("command", [])
                envs.append((f"compose {name}", list(s.get("environment", {})),
                             " ".join(cmd) if isinstance(cmd, list) else cmd))
        for where, names, cmd in envs:
            for var in names:
                if var.startswith("FLATSHARD_") and var not in read_by_programs and \
                        var not in cmd and var not in hook:
                    problems.append(f"{where}: {var}")
        assert not problems, "set but read by nothing: " + "; ".join(problems)


kubectl = subprocess.run(["sh", "-c", "command -v kubectl"], capture_output=True, text=True)
if kubectl.returncode != 0:
    skip("docs: kubectl flags", "kubectl is not installed")
else:
    @check("docs: every kubectl flag in docs/deploy.md exists (kubectl SUBCOMMAND --help)")
    def _():
        global_flags = set(re.findall(r"(--[\w-]+)", subprocess.run(
            ["kubectl", "options"], capture_output=True, text=True).stdout)) | {"-n"}
        problems, seen = [], 0
        for _, line in logical_lines(code_text(read("docs/deploy.md"))):
            m = re.search(r"\bkubectl (.*?)(?:\||;|&&|$)", line)
            if not m:
                continue
            tokens = m.group(1).split()
            words, flags, i = [], [], 0
            while i < len(tokens):
                t = tokens[i]
                if t == "-n":
                    i += 2
                    continue
                flag = re.match(r"(--?[A-Za-z][\w-]*)", t)
                if flag:
                    flags.append(flag.group(1))
                elif not flags and len(words) < 3 and re.fullmatch(r"[a-z-]+", t):
                    words.append(t)
                i += 1
            for n in range(len(words), 0, -1):  # the longest prefix that is a command
                r = subprocess.run(["kubectl", *words[:n], "--help"], capture_output=True, text=True)
                if r.returncode == 0 and words[:n][-1] in r.stdout.split("Usage:")[-1]:
                    break
            seen += 1
            known = set(re.findall(r"(--?[\w-]+)", r.stdout)) | global_flags
            bad = [f for f in flags if f not in known]
            if bad:
                problems.append(f"kubectl {' '.join(words[:n])}: {', '.join(bad)}")
        assert seen >= 5, f"only {seen} kubectl commands found"
        assert not problems, "; ".join(problems)

sys.exit(1 if failures else 0)
