"""deploy_test.sh's live checks: the commands the Compose services and the
Kubernetes containers run, run for real with the built programs, as
deploy/ writes them.

    unshare --pid --fork --mount --net --mount-proc python3 live_checks.py SOURCE_DIR RUN_DIR BIN_DIR

It must be PID 1 of a PID, mount and network namespace of its own: every
daemon it starts dies with it, the names the daemons dial (coordinator,
worker-0, flatshard-worker-0.flatshard-worker.flatshard.svc, ...) resolve
through a private /etc/hosts to loopback addresses of a private network, and
the paths they use (/var/lib/flatshard) are a tmpfs. What differs from a real
engine: the containers share one network namespace, so each binds its own
loopback address where deploy/ says 0.0.0.0; and Kubernetes volumes are
directories whose paths replace the mount paths in the containers' commands
and environment. Prints PASS:/FAIL: lines; exits 1 if any check failed.
"""
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time

import yaml

from docs_commands import code_text, documented_secrets, logical_lines

SRC, RUN, BIN = sys.argv[1], sys.argv[2], sys.argv[3]
LIVE = os.path.join(RUN, "live")
PATH = f"{BIN}:/usr/local/bin:/usr/bin:/bin"
failures = 0
daemons = []

HOSTS = {
    # compose.yaml's service names
    "coordinator": "127.0.1.1", "worker-0": "127.0.1.2", "worker-1": "127.0.1.3",
    # the Kubernetes Service and the worker pods' DNS names, namespace flatshard
    "flatshard-coordinator": "127.0.2.1",
    "flatshard-worker-0.flatshard-worker.flatshard.svc": "127.0.2.2",
    "flatshard-worker-1.flatshard-worker.flatshard.svc": "127.0.2.3",
}


def check(name, ok, why=""):
    global failures
    if ok:
        print(f"PASS: {name}")
    else:
        failures += 1
        print(f"FAIL: {name}: {why}")
    return ok


def run(argv, env, timeout=60, cwd=None):
    return subprocess.run(argv, env={"PATH": PATH, "HOME": LIVE, **env}, cwd=cwd or LIVE,
                          capture_output=True, text=True, timeout=timeout)


def start(name, argv, env, ip, cwd):
    """A daemon, with 0.0.0.0 in its command bound to its own address instead."""
    argv = [a.replace("0.0.0.0", ip) for a in argv]
    log = open(os.path.join(LIVE, f"{name}.log"), "w")
    p = subprocess.Popen(argv, env={"PATH": PATH, "HOME": LIVE, **env}, cwd=cwd,
                         stdout=log, stderr=subprocess.STDOUT)
    daemons.append((name, p))
    return p


def log_of(name):
    with open(os.path.join(LIVE, f"{name}.log")) as f:
        return f.read()


def stop_daemons():
    for _, p in daemons:
        p.terminate()
    for _, p in daemons:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
    daemons.clear()


def wait_for_workers(env, count, timeout=30):
    deadline = time.time() + timeout
    last = ""
    while time.time() < deadline:
        for name, p in daemons:
            if p.poll() is not None:
                return None, f"{name} exited {p.returncode}: {log_of(name)[-600:]}"
        r = run(["flatshard", "workers", "--json"], env, timeout=20)
        last = r.stdout + r.stderr
        if r.returncode == 0:
            workers = json.loads(r.stdout).get("workers", [])
            if len(workers) >= count:
                return workers, ""
        time.sleep(0.3)
    return None, f"no {count} workers within {timeout}s: {last[-600:]}"


def field(worker, name):
    camel = re.sub(r"_(\w)", lambda m: m.group(1).upper(), name)
    return worker.get(name, worker.get(camel))


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def setup():
    os.makedirs(LIVE, exist_ok=True)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    # Nothing outside RUN_DIR may be written by what runs here: /etc
    # read-only, /var/lib a tmpfs.
    subprocess.run(["mount", "--bind", "/etc", "/etc"], check=True)
    subprocess.run(["mount", "-o", "remount,bind,ro", "/etc"], check=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", "/var/lib"], check=True)
    hosts = os.path.join(LIVE, "hosts")
    with open(hosts, "w") as f:
        f.write("127.0.0.1 localhost\n")
        for name, ip in HOSTS.items():
            f.write(f"{ip} {name}\n")
        f.write(f"{HOSTS['flatshard-coordinator']} flatshard-coordinator.flatshard.svc\n")
    subprocess.run(["mount", "--bind", hosts, "/etc/hosts"], check=True)


# ------------------------------------------------------------------- Compose

def compose():
    with open(os.path.join(SRC, "deploy/docker/compose.yaml")) as f:
        services = yaml.safe_load(f)["services"]
    root = "/var/lib/flatshard"
    # What the image's `install -d` makes, owned by its user: here, by us.
    for d in ("state", "checkpoints", "tls/ca", "tls/coordinator", "tls/worker", "tls/client"):
        os.makedirs(f"{root}/{d}", exist_ok=True)

    def command(service):
        cmd = services[service].get("entrypoint") or services[service]["command"]
        return [c.replace("$$", "$") for c in cmd]

    certs = services["certs"]
    script = os.path.join(SRC, "deploy/docker/init-secrets.sh")
    mounted = command("certs")[-1]
    assert mounted.endswith("init-secrets.sh"), mounted
    init = ["sh", script]
    r = run(init, certs["environment"])
    if not check("compose: the certs service (init-secrets.sh) makes the CA, the certificates "
                 "and the operator token", r.returncode == 0 and
                 os.path.exists(f"{root}/tls/worker/worker-key.pem") and
                 os.path.getsize(f"{root}/tls/client/operator.token") > 0,
                 r.stdout + r.stderr):
        return
    ca, tokens = sha(f"{root}/tls/ca/ca.pem"), sha(f"{root}/tls/coordinator/tokens")
    r = run(init, certs["environment"])
    check("compose: the certs service run again keeps the CA and the token",
          r.returncode == 0 and sha(f"{root}/tls/ca/ca.pem") == ca and
          sha(f"{root}/tls/coordinator/tokens") == tokens, r.stdout + r.stderr)

    start("compose-coordinator", command("coordinator"), services["coordinator"]["environment"],
          HOSTS["coordinator"], root)
    for w in ("worker-0", "worker-1"):
        start(f"compose-{w}", command(w), services[w]["environment"], HOSTS[w], root)
    cli = services["cli"]["environment"]
    workers, why = wait_for_workers(cli, 2)
    if check("compose: coordinator and two workers run with the services' commands and "
             "register under mutual TLS (the cli service's admin certificate lists them)",
             workers is not None, why):
        ids = sorted((field(w, "worker_id"), field(w, "metrics_address")) for w in workers)
        check("compose: worker-N registers as worker-N, its metrics at worker-N:9400",
              ids == [("worker-0", "worker-0:9400"), ("worker-1", "worker-1:9400")], ids)
        check("compose: the coordinator serves mutual TLS with authenticated callers",
              "mutual TLS" in log_of("compose-coordinator"), log_of("compose-coordinator")[-400:])
        worker_cert = {k: v for k, v in services["worker-0"]["environment"].items()
                       if k.startswith("FLATSHARD_")}
        refused = run(["flatshard", "workers"], worker_cert)
        allowed = run(["flatshard", "workers"],
                      {**worker_cert, "FLATSHARD_TOKEN_FILE": f"{root}/tls/client/operator.token"})
        check("compose: a non-admin certificate needs the operator token (refused without it, "
              "served with it)", refused.returncode == 2 and allowed.returncode == 0,
              f"without: {refused.returncode} {refused.stderr.strip()}; "
              f"with: {allowed.returncode} {allowed.stderr.strip()}")
    stop_daemons()
    r = run(init, {**certs["environment"],
                   "FLATSHARD_CERT_HOSTS": certs["environment"]["FLATSHARD_CERT_HOSTS"] + ",extra"})
    worker_names = subprocess.run(
        ["openssl", "x509", "-in", f"{root}/tls/worker/worker.pem", "-noout", "-ext",
         "subjectAltName"], capture_output=True, text=True).stdout
    check("compose: a changed host list renews the coordinator's and workers' certificates "
          "from the same CA",
          r.returncode == 0 and sha(f"{root}/tls/ca/ca.pem") == ca and
          "DNS:extra" in worker_names and "renewed" in r.stdout, r.stdout + r.stderr + worker_names)


# ---------------------------------------------------------------- Kubernetes

def kubernetes():
    with open(os.path.join(RUN, "k8s-base.yaml")) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    with open(os.path.join(SRC, "docs/deploy.md")) as f:
        markdown = f.read()
    k8s = os.path.join(LIVE, "k8s")
    cwd = os.path.join(k8s, "operator")  # where the operator runs docs/deploy.md's commands
    os.makedirs(cwd)

    # docs/deploy.md's certificate and token commands, as written.
    section = markdown.split("## Kubernetes")[1].split("\n## ")[0]
    commands = [line for _, line in logical_lines(code_text(section))
                if re.match(r"flatshard (certs init|token create) ", line)]
    for line in commands:
        r = run(["bash", "-c", line], {}, cwd=cwd)
        if not check(f"k8s: docs/deploy.md's `{line[:60]}...` runs", r.returncode == 0,
                     r.stdout + r.stderr):
            return
    # The Secrets, as the documented `kubectl create secret` would make them.
    secrets = documented_secrets(markdown)
    for name, keys in secrets.items():
        os.makedirs(os.path.join(k8s, "secret", name))
        for key, (kind, value) in keys.items():
            target = os.path.join(k8s, "secret", name, key)
            if kind == "literal":
                with open(target, "w") as f:
                    f.write(value)
            else:
                shutil.copy(os.path.join(cwd, value), target)
    ns = next(d["metadata"]["namespace"] for d in docs if d["kind"] == "StatefulSet")
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}

    def pod(workload, pod_name, ordinal):
        """argv, env and preStop argv of a pod's first container, its volumes as directories."""
        spec = workload["spec"]["template"]["spec"]
        c = spec["containers"][0]
        mounts = {}
        for m in c.get("volumeMounts", []):
            v = next(v for v in spec["volumes"] if v["name"] == m["name"])
            if "persistentVolumeClaim" in v:
                d = os.path.join(k8s, "pvc", v["persistentVolumeClaim"]["claimName"])
            elif "secret" in v:
                d = os.path.join(k8s, "secret", v["secret"]["secretName"])
                assert os.path.isdir(d) or v["secret"].get("optional"), \
                    f"{pod_name}: Secret {v['secret']['secretName']} is not made by docs/deploy.md"
            elif "configMap" in v:
                d = os.path.join(k8s, "configmap", v["configMap"]["name"])
                os.makedirs(d, exist_ok=True)
                for key, text in configmaps[v["configMap"]["name"]]["data"].items():
                    with open(os.path.join(d, key), "w") as f:
                        f.write(text)
            else:
                d = os.path.join(k8s, "emptydir", pod_name, v["name"])
            os.makedirs(d, exist_ok=True)
            mounts[m["mountPath"].rstrip("/")] = d

        # One pass, longest mount path first, whole path components only.
        pattern = re.compile(r"(?<![\w/.-])(" + "|".join(
            re.escape(mp) for mp in sorted(mounts, key=len, reverse=True)) + r")(?=$|[/}\s])")

        def paths(text):
            return pattern.sub(lambda m: mounts[m.group(1)], text)

        env = {}
        for e in c.get("env", []):
            if "value" in e:
                env[e["name"]] = paths(e["value"])
                continue
            source = e["valueFrom"]
            if "fieldRef" in source:
                env[e["name"]] = {
                    "metadata.name": pod_name, "metadata.namespace": ns,
                    "metadata.labels['apps.kubernetes.io/pod-index']": str(ordinal),
                }[source["fieldRef"]["fieldPath"]]
            else:  # resourceFieldRef requests.cpu, divisor 1: rounded up
                cpu = c["resources"]["requests"]["cpu"]
                cpus = int(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)
                env[e["name"]] = str(math.ceil(cpus))
        # The hook's default Secret directory is a mount path as well.
        env.setdefault("FLATSHARD_DRAIN_DIR", paths("/etc/flatshard/drain"))

        def expand(argv):  # env's values have their paths replaced already
            return [re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), paths(a))
                    for a in argv]

        argv = expand(c.get("command", []) + c.get("args", []))
        pre_stop = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
        return argv, env, expand(pre_stop) if pre_stop else None

    coordinator = next(d for d in docs if d["kind"] == "Deployment")
    workers = next(d for d in docs if d["kind"] == "StatefulSet")
    argv, env, _ = pod(coordinator, "flatshard-coordinator-0", 0)
    start("k8s-coordinator", argv, env, HOSTS["flatshard-coordinator"], "/var/lib")
    hooks = []
    for i in range(2):
        name = f"{workers['metadata']['name']}-{i}"
        argv, env, pre_stop = pod(workers, name, i)
        host = next(a.split("=", 1)[1] for a in argv if a.startswith("--advertise-host="))
        start(f"k8s-{name}", argv, env, HOSTS[host], "/var/lib")
        hooks.append((pre_stop, env))
    admin = {"FLATSHARD_COORDINATOR": "flatshard-coordinator:7070",
             "FLATSHARD_TLS_CA": f"{cwd}/flatshard-ca/ca.pem",
             "FLATSHARD_TLS_CERT": f"{cwd}/flatshard-ca/admin.pem",
             "FLATSHARD_TLS_KEY": f"{cwd}/flatshard-ca/admin-key.pem"}
    registered, why = wait_for_workers(admin, 2)
    if not check("k8s: the coordinator and two worker pods' containers run as rendered, with the "
                 "documented Secrets, and register under mutual TLS", registered is not None, why):
        return

    job_name = secrets["flatshard-drain"]["job"][1]
    with open(os.path.join(SRC, "examples/mlp-job.yaml")) as f:
        job = f.read()
    job = re.sub(r"^world_size: \d+", "world_size: 2", job, flags=re.M)
    job = re.sub(r"^model: (\S+)", lambda m: f"model: {SRC}/examples/{m.group(1)}", job, flags=re.M)
    with open(os.path.join(cwd, "job.yaml"), "w") as f:
        f.write(job)
    r = run(["flatshard", "job", "create", "-f", "job.yaml", "--name", job_name, "--timeout", "60"],
            admin, timeout=90, cwd=cwd)
    if not check("k8s: a job of world size 2 forms on the pods: the coordinator dials each worker "
                 "at <pod>.flatshard-worker.<namespace>.svc (the wildcard certificate), Gloo "
                 "binds those names", r.returncode == 0, r.stdout + r.stderr):
        return
    listed = json.loads(run(["flatshard", "workers", "--json"], admin).stdout)["workers"]
    ranks = sorted((field(w, "worker_id"), field(w, "rank") or 0) for w in listed)
    check("k8s: pod flatshard-worker-N has rank N in the job (--rank from the pod-index label)",
          ranks == [("flatshard-worker-0", 0), ("flatshard-worker-1", 1)], ranks)

    # Both preStop hooks at once, as a drain of their node would run them.
    running = [subprocess.Popen(argv, env={"PATH": PATH, "HOME": LIVE, **env}, cwd="/",
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for argv, env in hooks]
    outputs = [p.communicate(timeout=120)[0] for p in running]
    codes = [p.returncode for p in running]
    listed = run(["flatshard", "ckpt", "ls", "-j", job_name], admin)
    drains = [line.split()[0] for line in listed.stdout.split("\n") if line.startswith("drain-")]
    check("k8s: two preStop hooks racing save exactly one drain checkpoint, and both wait for it",
          codes == [0, 0] and len(drains) == 1 and all("drain-" in o for o in outputs),
          f"exit codes {codes}, checkpoints {drains}, hooks said: {' | '.join(outputs)}")
    stop_daemons()


def main():
    setup()
    for scenario in (compose, kubernetes):
        try:
            scenario()
        except Exception as e:  # a broken scenario fails, visibly
            check(f"{scenario.__name__}: ran to the end", False, f"{type(e).__name__}: {e}")
        finally:
            stop_daemons()
    sys.exit(1 if failures else 0)


main()
