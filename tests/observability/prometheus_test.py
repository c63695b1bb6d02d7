#!/usr/bin/env python3
"""Issue #6's end-to-end check against a real Prometheus: `flatshard up
--prometheus` runs a 4-worker cluster and a Prometheus (the Debian package)
scraping it; while the cluster trains and a second client takes a checkpoint
on demand, Prometheus scrapes every daemon. Then, through Prometheus's HTTP
API: every target is up, every rule group loaded and evaluates without
error, every PromQL expression of every dashboard panel (and variable)
evaluates and returns data, every recording rule returns data, every alert
rule evaluates, and none fires on this healthy cluster.

    prometheus_test.py BIN_DIR SOURCE_DIR WORK_DIR
"""
import datetime
import json
import math
import pathlib
import re
import shutil
import subprocess
import sys
import time

from local_cluster import LocalCluster, prometheus_api

WORKERS = 4
STEPS = 40
JOB = "mlp-demo"
# What the dashboards' variables stand for when a panel is evaluated here.
VARIABLES = {"$job_name": JOB, "$rank": ".*", "$__rate_interval": "1m", "$__range": "5m",
             "$__interval": "5s"}


def substitute(expr):
    for name in sorted(VARIABLES, key=len, reverse=True):
        expr = expr.replace(name, VARIABLES[name])
    leftover = re.findall(r"\$\{?\w+", expr)
    assert not leftover, f"unknown dashboard variable {leftover} in: {expr}"
    return expr


def wait_for(what, condition, timeout=120):
    """Prometheus has no way to notify a client when it has scraped: poll its
    API for the condition, bounded."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def parse_time(text):
    """Prometheus's RFC 3339 timestamps (local zone, nanoseconds) as aware datetimes."""
    m = re.fullmatch(r"(.+T\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)", text)
    assert m, f"unexpected timestamp {text}"
    fraction = (m.group(2) or ".0")[:7]
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    return datetime.datetime.fromisoformat(m.group(1) + fraction + zone)


def selectors(expr):
    """The vector selectors of a PromQL expression (metric{matchers}), without
    ranges or offsets: each must return data, or the rule has a typo."""
    out = []
    for m in re.finditer(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?", expr):
        name, end = m.group(1), m.end()
        if name in ("by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
                    "unless", "offset", "bool") or expr[end:end + 1] == "(":
            continue
        if m.start() > 0 and expr[m.start() - 1] in "[0123456789.":
            continue  # a duration like 10m
        if not (name.startswith("flatshard") or name == "up"):
            continue
        out.append(name + (m.group(2) or ""))
    return out


def has_finite_value(result):
    return any(math.isfinite(float(r["value"][1])) for r in result)


def dashboard_queries(source):
    """(where, expr) for every panel target and query variable of every dashboard."""
    out = []
    for path in sorted((source / "dashboards").glob("*.json")):
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                out.append((f"{path.name}: '{panel['title']}' {target['refId']}", target["expr"]))
        for var in board["templating"]["list"]:
            if var["type"] == "query":
                out.append((f"{path.name}: variable {var['name']}", var["definition"]))
    return out


def check_label_values(base, where, definition):
    m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", definition)
    assert m, f"{where}: unsupported variable query {definition}"
    values = prometheus_api(base, f"label/{m.group(2)}/values",
                            **{"match[]": substitute(m.group(1))})
    assert values, f"{where}: {definition} has no values"


def rules_in_file(path):
    """How many rules the file holds, as promtool counts them."""
    out = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True,
                         text=True, check=True).stdout
    return int(re.search(r"SUCCESS: (\d+) rules found", out).group(1))


def check_refusals(bin_dir, work):
    """`up --prometheus` with options that cannot work says why, naming the
    flag, and exits 2 before it starts anything."""
    failures = []
    any_port = ["--prometheus-listen", "127.0.0.1:0"]
    cases = [
        (any_port + ["--prometheus-binary", str(work / "no-such-prometheus")],
         "--prometheus-binary"),
        (any_port + ["--prometheus-config-dir", str(work / "no-such-dir")],
         "--prometheus-config-dir"),
        (["--prometheus-listen", "127.0.0.1"], "--prometheus-listen"),
        (any_port + ["--scrape-interval", "0"], "--scrape-interval"),
    ]
    for extra, flag in cases:
        run = subprocess.run([f"{bin_dir}/flatshard", "up", "--workers", "1", "--listen",
                              "127.0.0.1:0", "--checkpoint-dir", str(work / "refused"),
                              "--prometheus", *extra],
                             capture_output=True, text=True, timeout=120)
        if run.returncode != 2 or flag not in run.stderr or "starting" in run.stdout:
            failures.append(f"up {' '.join(extra)}: exit {run.returncode}, stderr: {run.stderr}")
    return failures


def main():
    bin_dir, source, work = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    refusals = check_refusals(bin_dir, work)
    expected_rules = rules_in_file(source / "deploy/prometheus/flatshard-rules.yml")
    args = ["--workers", str(WORKERS), "--listen", "127.0.0.1:0", "--job",
            str(source / "examples/mlp-job.yaml"), "--checkpoint-dir", str(work / "ckpt"),
            "--prometheus", "--prometheus-listen", "127.0.0.1:0", "--scrape-interval", "1",
            "--prometheus-config-dir", str(source / "deploy/prometheus"),
            "--prometheus-data-dir", str(work / "prometheus")]
    with LocalCluster(bin_dir, args) as cluster:
        base = cluster.prometheus
        assert base, "flatshard up --prometheus printed no prometheus URL:\n" + "\n".join(
            cluster.lines)

        # Every daemon is a target and up.
        def targets_up():
            active = prometheus_api(base, "targets")["activeTargets"]
            return len(active) == WORKERS + 1 and all(t["health"] == "up" for t in active) \
                and active
        active = wait_for("all targets up", targets_up)
        jobs = sorted(t["labels"]["job"] for t in active)
        assert jobs == ["flatshard-coordinator"] + ["flatshard-worker"] * WORKERS, jobs

        # Train while Prometheus scrapes; a second client checkpoints mid-way.
        half = cluster.flatshard("train", "-j", JOB, "--steps", str(STEPS // 2))
        saved = cluster.flatshard("ckpt", "save", "-j", JOB, "-n", "mid", "-t", "sharded")
        assert "mid" in saved.stdout, saved.stdout
        cluster.flatshard("train", "-j", JOB, "--steps", str(STEPS - STEPS // 2))

        # Prometheus has scraped the finished run, and evaluated every rule.
        wait_for("the last step scraped", lambda: any(
            float(r["value"][1]) == STEPS for r in prometheus_api(
                base, "query", query=f'flatshard_job_step{{job_name="{JOB}"}}')["result"]))
        wait_for("a checkpoint scraped", lambda: prometheus_api(
            base, "query", query="flatshard_checkpoint_last_success_timestamp_seconds")["result"])
        started = time.time()

        def evaluated_since_run():
            groups = prometheus_api(base, "rules")["groups"]
            after = datetime.datetime.fromtimestamp(started + 1, datetime.timezone.utc)
            rules = [r for g in groups for r in g["rules"]]
            done = len(rules) == expected_rules and all(
                parse_time(r["lastEvaluation"]) >= after for r in rules)
            return rules if done else None
        rules = wait_for("every rule evaluated after the run", evaluated_since_run)

        failures = refusals
        for rule in rules:
            if rule["health"] != "ok" or rule.get("lastError"):
                failures.append(f"rule {rule['name']}: {rule['health']} {rule.get('lastError')}")

        checked = checked_selectors = 0
        for where, expr in dashboard_queries(source):
            try:
                if expr.startswith("label_values("):
                    check_label_values(base, where, expr)
                else:
                    result = prometheus_api(base, "query", query=substitute(expr))["result"]
                    if not has_finite_value(result):
                        failures.append(f"{where}: no data (or only NaN) for {expr}")
                checked += 1
            except AssertionError as e:
                failures.append(f"{where}: {e}")

        for rule in rules:
            try:
                result = prometheus_api(base, "query", query=rule["query"])["result"]
            except AssertionError as e:
                failures.append(f"rule {rule['name']}: {e}")
                continue
            if rule["type"] == "recording" and not has_finite_value(result):
                failures.append(f"recording rule {rule['name']} returns no data")
            if rule["type"] == "alerting":
                # Every alert is meant to stay silent on a healthy cluster; what
                # it reads must exist, or a misspelt name keeps it silent forever.
                if result:
                    failures.append(f"alert {rule['name']} would fire on a healthy cluster: "
                                    f"{result}")
                for selector in selectors(rule["query"]):
                    if not prometheus_api(base, "query", query=selector)["result"]:
                        failures.append(f"alert {rule['name']}: {selector} has no data")
                    checked_selectors += 1

        active_alerts = [a for a in prometheus_api(base, "alerts")["alerts"]
                         if a["labels"]["alertname"].startswith("Flatshard")]
        if active_alerts:
            failures.append(f"alerts active on a healthy cluster: {active_alerts}")

    if failures:
        print("\n".join(failures))
        return 1
    print(f"prometheus_test: {len(active)} targets up, {len(rules)} rules ok, "
          f"{checked} dashboard queries return data, {checked_selectors} alert inputs exist")
    return 0


if __name__ == "__main__":
    sys.exit(main())
