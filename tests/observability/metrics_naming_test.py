#!/usr/bin/env python3
"""Reads /metrics from every daemon of a local cluster that has trained and
checkpointed, and checks docs/architecture.md §7's conventions: every family has HELP
and TYPE and the flatshard_ prefix, base units (_seconds, _bytes), _total on
counters and only on them, labels from a fixed, bounded set (rank as a
label, never a step or seq), series that do not multiply as training goes
on; and `promtool check metrics` finds nothing to lint.

    metrics_naming_test.py BIN_DIR SOURCE_DIR WORK_DIR
"""
import collections
import pathlib
import re
import shutil
import subprocess
import sys

from local_cluster import LocalCluster, http_get

WORKERS = 2
JOB = "naming-job"
# prometheus-cpp's Exposer adds its own scrape statistics; they are not ours
# to rename.
THIRD_PARTY = ("exposer_",)
# Every label flatshard uses, and what bounds its values.
LABELS = {
    "job_name": "jobs of this coordinator",
    "rank": "the world size",
    "op": "the collective ops",
    "group": "world, shard, replicate, checkpoint",
    "kind": "memory kinds, or batch kinds",
    "state": "job states, or device memory states",
    "device": "the device kinds: cpu, cuda, sim",
    "type": "state-dict types",
    "method": "the gRPC methods served",
    "code": "gRPC status codes",
    "component": "coordinator, worker",
    "version": "build info",
    "revision": "build info",
    "compiler": "build info",
    "cuda": "build info",
    "le": "histogram buckets",
    "quantile": "summary quantiles",
}
# Prefixed or abbreviated units; a bare singular unit, except in a rate
# ("_per_second").
NON_BASE_UNITS = re.compile(
    r"_((milli|micro|nano|kilo|mega|giga)(seconds?|bytes?)|(?<!_per_)second|byte|ms|us|ns|kb|mb|"
    r"gb|kib|mib|gib|minutes?|hours?|days?|percent)(_|$)")
TIME_WORDS = re.compile(r"(duration|latency|_age|_time)(_|$)")
SERIES_PER_FAMILY_LIMIT = 64  # label sets, buckets not counted


def parse(text):
    """{family: {"type", "help", "series": set of (sample name, labels)}}."""
    families = collections.defaultdict(lambda: {"type": None, "help": None, "series": set()})
    for line in text.splitlines():
        if m := re.match(r"# (HELP|TYPE) (\S+) ?(.*)", line):
            families[m.group(2)]["help" if m.group(1) == "HELP" else "type"] = m.group(3)
        elif line and not line.startswith("#"):
            m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)", line)
            assert m, f"unparsable sample line: {line}"
            name, labels = m.group(1), tuple(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"',
                                                        m.group(3) or ""))
            family = re.sub(r"_(bucket|sum|count)$", "", name)
            if family not in families:
                family = name
            families[family]["series"].add((name, labels))
    return families


def check_daemon(where, text, failures):
    families = parse(text)
    for name, f in families.items():
        if name.startswith(THIRD_PARTY):
            continue
        problem = lambda msg: failures.append(f"{where}: {name}: {msg}")  # noqa: E731
        if not name.startswith("flatshard_"):
            problem("no flatshard_ prefix")
        if not f["help"]:
            problem("no HELP text")
        if f["type"] not in ("counter", "gauge", "histogram"):
            problem(f"TYPE {f['type']}")
        if (f["type"] == "counter") != name.endswith("_total"):
            problem("counters, and only counters, end in _total")
        if NON_BASE_UNITS.search(name):
            problem("not in base units (_seconds, _bytes)")
        if TIME_WORDS.search(name) and not re.search(r"_seconds(_total)?$", name):
            problem("a time that is not in _seconds")
        if "bytes" in name and not re.search(r"_bytes(_total)?$", name):
            problem("bytes that do not end in _bytes")
        label_sets = set()
        for _, labels in f["series"]:
            label_sets.add(tuple(l for l in labels if l[0] != "le"))
            for key, value in labels:
                if key not in LABELS:
                    problem(f"label {key} is not one of the bounded labels")
                if key == "rank" and not (value.isdigit() and int(value) < WORKERS):
                    problem(f"rank label {value} is not a rank")
                if key not in ("rank", "le", "quantile", "version", "revision") and re.fullmatch(r"\d+", value):
                    problem(f"label {key}={value} looks like an id (steps and seqs are values)")
        if len(label_sets) > SERIES_PER_FAMILY_LIMIT:
            problem(f"{len(label_sets)} series")
    return families


def promtool_lint(where, text, failures):
    ours = "\n".join(block for block in re.split(r"\n(?=# HELP )", text)
                     if not block.split(" ", 3)[2].startswith(THIRD_PARTY)) + "\n"
    lint = subprocess.run(["promtool", "check", "metrics"], input=ours, capture_output=True,
                          text=True)
    if lint.returncode != 0 or lint.stdout.strip() or lint.stderr.strip():
        failures.append(f"{where}: promtool check metrics: {lint.stdout}{lint.stderr}")


def main():
    bin_dir, source, work = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    job = (source / "examples/mlp-job.yaml").read_text()
    job = job.replace("name: mlp-demo", f"name: {JOB}").replace("world_size: 4",
                                                                 f"world_size: {WORKERS}")
    job = job.replace("model: mlp.yaml", f"model: {source}/examples/mlp.yaml")
    (work / "job.yaml").write_text(job)
    failures = []
    args = ["--workers", str(WORKERS), "--listen", "127.0.0.1:0", "--job", str(work / "job.yaml"),
            "--checkpoint-dir", str(work / "ckpt")]
    with LocalCluster(bin_dir, args) as cluster:
        daemons = {"coordinator": cluster.coordinator_metrics}
        daemons.update({f"worker {i}": a for i, a in enumerate(cluster.worker_metrics)})
        assert len(daemons) == WORKERS + 1 and all(daemons.values()), cluster.lines

        cluster.flatshard("train", "-j", JOB, "--steps", "3")
        cluster.flatshard("ckpt", "save", "-j", JOB, "-t", "full")
        first = {}
        for where, address in daemons.items():
            text = http_get(f"http://{address}/metrics")
            first[where] = check_daemon(where, text, failures)
            promtool_lint(where, text, failures)
        for family in ("flatshard_build_info", "flatshard_steps_total", "flatshard_worker_up",
                       "flatshard_job_state", "flatshard_checkpoints_total",
                       "flatshard_rpc_duration_seconds"):
            if family not in first["coordinator"]:
                failures.append(f"coordinator: no {family}")
        for family in ("flatshard_build_info", "flatshard_collective_duration_seconds",
                       "flatshard_collective_bytes_total", "flatshard_unshards_total",
                       "flatshard_memory_bytes", "flatshard_rank_last_completed_seq",
                       "flatshard_device_memory_bytes"):
            if family not in first["worker 0"]:
                failures.append(f"worker 0: no {family}")

        # More steps and another checkpoint add no series: nothing is keyed
        # by step, seq or checkpoint name.
        cluster.flatshard("train", "-j", JOB, "--steps", "3")
        cluster.flatshard("ckpt", "save", "-j", JOB, "-t", "full")
        for where, address in daemons.items():
            again = parse(http_get(f"http://{address}/metrics"))
            for name, f in again.items():
                if name.startswith(THIRD_PARTY) or name == "flatshard_rpc_duration_seconds":
                    continue  # a method first called now is a new (bounded) series
                before = first[where].get(name, {"series": set()})["series"]
                grown = f["series"] - before
                if grown:
                    failures.append(f"{where}: {name} grew by {sorted(grown)[:3]}")

    if failures:
        print("\n".join(failures))
        return 1
    print(f"metrics_naming_test: {len(daemons)} daemons follow the conventions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
