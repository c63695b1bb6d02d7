#!/usr/bin/env python3
"""Writes flatshard's Grafana dashboards (dashboards/*.json) from the panel
lists below, so the five dashboards share their variables, layout and
datasource handling. Run it after editing a panel; `--check` (run by the
tests) fails when a committed dashboard differs from what this generates.

Every panel's PromQL uses only the variables $job_name, $rank and
$__rate_interval; tests/observability/prometheus_test.py evaluates each one
against a Prometheus scraping a training cluster.
"""
import argparse
import json
import pathlib
import sys

DS = {"type": "prometheus", "uid": "${datasource}"}
JOB = 'job_name="$job_name"'
JOB_RANK = 'job_name="$job_name", rank=~"$rank"'
# Bandwidth: barriers move no bytes, and background peer snapshot exchanges
# are not training traffic.
BW = JOB_RANK + ', op!="barrier"'
BW_TRAIN = BW + ', group!="snapshot"'
RATE = "$__rate_interval"


def q(expr, legend=""):
    return {"expr": expr, "legendFormat": legend}


def timeseries(title, unit, targets, description="", stack=False, width=12):
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "width": width,
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "custom": {"stacking": {"mode": "normal" if stack else "none"},
                           "fillOpacity": 20 if stack else 0},
            },
            "overrides": [],
        },
        "options": {"legend": {"displayMode": "table", "placement": "bottom",
                               "calcs": ["lastNotNull", "max"]},
                    "tooltip": {"mode": "multi"}},
        "targets": targets,
    }


def stat(title, unit, targets, description="", width=4):
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "width": width,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"reduceOptions": {"calcs": ["lastNotNull"]}, "textMode": "value_and_name",
                    "colorMode": "value"},
        "targets": targets,
    }


def table(title, targets, description="", width=24):
    return {
        "type": "table",
        "title": title,
        "description": description,
        "width": width,
        "fieldConfig": {"defaults": {}, "overrides": []},
        "options": {"showHeader": True},
        "transformations": [{"id": "labelsToFields", "options": {}}],
        "targets": [dict(t, instant=True, format="table") for t in targets],
    }


def quantiles(metric, selector, by, legend_prefix=""):
    """p50 and p99 of a histogram by `by` labels."""
    targets = []
    for quantile in ("0.5", "0.99"):
        labels = ", ".join(["le"] + by)
        legend = " ".join("{{%s}}" % b for b in by)
        targets.append(q(
            f"histogram_quantile({quantile}, sum by ({labels}) "
            f"(rate({metric}_bucket{{{selector}}}[{RATE}])))",
            f"{legend_prefix}{legend} p{int(float(quantile) * 100)}".strip()))
    return targets


VARIABLES = [
    {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "refresh": 1,
    },
    {
        "name": "job_name",
        "label": "Job",
        "type": "query",
        "datasource": DS,
        "definition": "label_values(flatshard_job_state, job_name)",
        "query": {"query": "label_values(flatshard_job_state, job_name)", "refId": "job_name"},
        "refresh": 2,
        "includeAll": False,
        "multi": False,
        "sort": 1,
        "current": {},
        "hide": 0,
    },
    {
        "name": "rank",
        "label": "Rank",
        "type": "query",
        "datasource": DS,
        "definition": 'label_values(flatshard_memory_bytes{job_name="$job_name"}, rank)',
        "query": {"query": 'label_values(flatshard_memory_bytes{job_name="$job_name"}, rank)',
                  "refId": "rank"},
        "refresh": 2,
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "sort": 3,
        "current": {"text": "All", "value": "$__all"},
        "hide": 0,
    },
]

DASHBOARDS = {
    "overview": {
        "uid": "flatshard-overview",
        "title": "flatshard / Cluster overview",
        "description": "Is the job training, how fast, and is every worker there?",
        "panels": [
            stat("Workers up", "none", [q("sum(flatshard_workers_up)", "up"),
                                        q("sum(flatshard_workers_registered)", "registered")],
                 "Workers heartbeating within the timeout, of those registered"),
            stat("Job state", "none", [q(f"flatshard_job_state{{{JOB}}} == 1", "{{state}}")],
                 "The state the job is in (PENDING, FORMING, READY, TRAINING, IDLE, FAILED, "
                 "STOPPED)"),
            stat("Step", "none", [q(f"flatshard_job_step{{{JOB}}}", "step")],
                 "Optimizer steps completed"),
            stat("Loss", "none", [q(f"flatshard_loss{{{JOB}}}", "loss")],
                 "Mean loss over the ranks in the last step"),
            stat("Samples/s", "none",
                 [q(f"rate(flatshard_samples_total{{{JOB}}}[{RATE}])", "samples/s")],
                 "Training throughput across all ranks"),
            stat("World size", "none", [q(f"flatshard_job_world_size{{{JOB}}}", "ranks")]),
            timeseries("Loss by rank", "none", [q(f"flatshard_loss{{{JOB}}}", "mean"),
                                        q(f"flatshard_rank_loss{{{JOB_RANK}}}", "rank {{rank}}")],
                       "Mean loss (coordinator) and each rank's loss on its local batch"),
            timeseries("Throughput", "none",
                       [q(f"rate(flatshard_samples_total{{{JOB}}}[{RATE}])", "samples/s"),
                        q(f"rate(flatshard_steps_total{{{JOB}}}[{RATE}])", "steps/s")]),
            timeseries("Step time", "s",
                       [q(f"rate(flatshard_step_duration_seconds_sum{{{JOB}}}[{RATE}]) / "
                          f"rate(flatshard_step_duration_seconds_count{{{JOB}}}[{RATE}])", "mean")]
                       + quantiles("flatshard_step_duration_seconds", JOB, ["job_name"]),
                       "Wall time of an optimizer step through the coordinator"),
            timeseries("Where step time goes (slowest rank)", "percentunit",
                       [q(f"rate(flatshard_step_compute_seconds_total{{{JOB}}}[{RATE}]) / "
                          f"rate(flatshard_step_duration_seconds_sum{{{JOB}}}[{RATE}])", "compute"),
                        q(f"rate(flatshard_step_exposed_comm_seconds_total{{{JOB}}}[{RATE}]) / "
                          f"rate(flatshard_step_duration_seconds_sum{{{JOB}}}[{RATE}])",
                          "exposed communication")],
                       "Fractions of step time: communication the prefetch policy did not hide "
                       "shows up as exposed", stack=True),
            timeseries("Gradient norm", "none", [q(f"flatshard_grad_norm{{{JOB}}}", "norm")],
                       "Total norm before clipping (-1 when the job does not clip)"),
            timeseries("Rank step time", "s",
                       [q(f"rate(flatshard_rank_step_duration_seconds_sum{{{JOB_RANK}}}[{RATE}]) /"
                          f" rate(flatshard_rank_step_duration_seconds_count{{{JOB_RANK}}}[{RATE}])",
                          "rank {{rank}}")],
                       "Each rank's time in its step program: a straggler stands out"),
            table("Builds", [q("flatshard_build_info", "")],
                  "Which flatshard build each daemon runs"),
        ],
    },
    "collectives": {
        "uid": "flatshard-collectives",
        "title": "flatshard / Collectives",
        "description": "All-gathers, reduce-scatters and all-reduces: time, bytes and bus "
                       "bandwidth (nccl-tests definitions) by op, group and rank",
        "panels": [
            timeseries("Collective latency by op", "s",
                       quantiles("flatshard_collective_duration_seconds", JOB_RANK, ["op"])),
            timeseries("Time in collectives by op", "percentunit",
                       [q(f"sum by (op) (rate(flatshard_collective_duration_seconds_sum"
                          f"{{{JOB_RANK}}}[{RATE}])) / scalar(count(count by (rank) "
                          f"(flatshard_collective_duration_seconds_count{{{JOB_RANK}}})))",
                          "{{op}}")],
                       "Share of wall time a rank spends inside collectives, averaged over ranks",
                       stack=True),
            timeseries("Bus bandwidth by op", "Bps",
                       [q(f"sum by (op) (rate(flatshard_collective_bus_bytes_total{{{BW}}}"
                          f"[{RATE}])) / sum by (op) (rate(flatshard_collective_duration_seconds_sum"
                          f"{{{BW}}}[{RATE}]))", "{{op}}")],
                       "nccl-tests busbw: size × bus factor (all-reduce 2(n-1)/n, all-gather and "
                       "reduce-scatter (n-1)/n, broadcast 1) over time; compare with the link"),
            timeseries("Algorithm bandwidth by op", "Bps",
                       [q(f"sum by (op) (rate(flatshard_collective_bytes_total{{{BW}}}"
                          f"[{RATE}])) / sum by (op) (rate(flatshard_collective_duration_seconds_sum"
                          f"{{{BW}}}[{RATE}]))", "{{op}}")],
                       "nccl-tests algbw: size over time"),
            timeseries("Bytes by op", "Bps",
                       [q(f"sum by (op) (rate(flatshard_collective_bytes_total{{{JOB_RANK}}}"
                          f"[{RATE}]))", "{{op}}")], stack=True),
            timeseries("Bus bandwidth by rank", "Bps",
                       [q(f"sum by (rank) (rate(flatshard_collective_bus_bytes_total{{{BW_TRAIN}}}"
                          f"[{RATE}])) / sum by (rank) (rate(flatshard_collective_duration_seconds_sum"
                          f"{{{BW_TRAIN}}}[{RATE}]))", "rank {{rank}}")],
                       "A rank whose bandwidth lags has a slow link or is a straggler"),
            timeseries("Collectives per second by group", "ops",
                       [q(f"sum by (group, op) (rate(flatshard_collective_duration_seconds_count"
                          f"{{{JOB_RANK}}}[{RATE}]))", "{{group}} {{op}}")]),
            timeseries("Unshards and reshards", "ops",
                       [q(f"sum by (rank) (rate(flatshard_unshards_total{{{JOB_RANK}}}[{RATE}]))",
                          "unshard rank {{rank}}"),
                        q(f"sum by (rank) (rate(flatshard_reshards_total{{{JOB_RANK}}}[{RATE}]))",
                          "reshard rank {{rank}}")],
                       "All-gathers issued for units (prefetches included) and units freed"),
            timeseries("Exposed communication by rank", "percentunit",
                       [q(f"rate(flatshard_rank_exposed_comm_seconds_total{{{JOB_RANK}}}[{RATE}]) /"
                          f" rate(flatshard_rank_step_duration_seconds_sum{{{JOB_RANK}}}[{RATE}])",
                          "rank {{rank}}")],
                       "Share of step time the compute lane waited on the communication lane"),
            timeseries("Collective failures", "short",
                       [q(f"sum by (rank, op) (increase(flatshard_collective_failures_total"
                          f"{{{JOB_RANK}}}[{RATE}]))", "rank {{rank}} {{op}}")]),
        ],
    },
    "memory": {
        "uid": "flatshard-memory",
        "title": "flatshard / Memory",
        "description": "What FSDP holds on each rank, by kind, and its peaks",
        "panels": [
            timeseries("Memory by kind", "bytes",
                       [q(f"sum by (kind) (flatshard_memory_bytes{{{JOB_RANK}}})", "{{kind}}")],
                       "Summed over the selected ranks", stack=True),
            timeseries("Peak memory by kind", "bytes",
                       [q(f"max by (kind) (flatshard_memory_peak_bytes{{{JOB_RANK}}})", "{{kind}}")],
                       "Highest on any selected rank since the job was configured"),
            timeseries("Memory by rank", "bytes",
                       [q(f"sum by (rank) (flatshard_memory_bytes{{{JOB_RANK}}})", "rank {{rank}}")]),
            timeseries("Unsharded parameters by rank", "bytes",
                       [q(f'flatshard_memory_bytes{{{JOB_RANK}, kind="unsharded_params"}}',
                          "rank {{rank}}"),
                        q(f'flatshard_memory_peak_bytes{{{JOB_RANK}, kind="unsharded_params"}}',
                          "rank {{rank}} peak")],
                       "All-gather buffers live at once: bounded by limit_all_gathers"),
            timeseries("Gradients and optimizer state by rank", "bytes",
                       [q(f'flatshard_memory_bytes{{{JOB_RANK}, kind=~"gradients|optimizer_state"}}',
                          "rank {{rank}} {{kind}}")]),
            table("Peak by rank and kind", [q(f"flatshard_memory_peak_bytes{{{JOB_RANK}}}", "")]),
        ],
    },
    "checkpoints": {
        "uid": "flatshard-checkpoints",
        "title": "flatshard / Checkpoints",
        "description": "Saves committed and failed, their duration and size, and how long since "
                       "the last one",
        "panels": [
            stat("Since last checkpoint", "s",
                 [q(f"flatshard_checkpoint_age_seconds{{{JOB}}}", "age")],
                 "Time since the last committed save (since the job was created while there is "
                 "none)", width=6),
            stat("Saved (1h)", "none",
                 [q(f"sum by (type) (increase(flatshard_checkpoints_total{{{JOB}}}[1h]))",
                    "{{type}}")], width=6),
            stat("Failed (1h)", "none",
                 [q(f"sum by (type) (increase(flatshard_checkpoint_failures_total{{{JOB}}}[1h]))",
                    "{{type}}")], width=6),
            stat("Last success", "dateTimeAsIso",
                 [q(f"flatshard_checkpoint_last_success_timestamp_seconds{{{JOB}}} * 1000", "at")],
                 width=6),
            timeseries("Save duration by type", "s",
                       [q(f"rate(flatshard_checkpoint_duration_seconds_sum{{{JOB}}}[1h]) / "
                          f"rate(flatshard_checkpoint_duration_seconds_count{{{JOB}}}[1h])",
                          "{{type}} mean")],
                       "Start to commit (async saves include the background write)"),
            timeseries("Save throughput by type", "Bps",
                       [q(f"increase(flatshard_checkpoint_bytes_total{{{JOB}}}[1h]) / "
                          f"increase(flatshard_checkpoint_duration_seconds_sum{{{JOB}}}[1h])",
                          "{{type}}")],
                       "Bytes committed over time spent saving"),
            timeseries("Checkpoint bytes written", "bytes",
                       [q(f"sum by (type) (increase(flatshard_checkpoint_bytes_total{{{JOB}}}"
                          f"[{RATE}]))", "{{type}}")], stack=True),
            timeseries("Saves and failures", "short",
                       [q(f"sum by (type) (increase(flatshard_checkpoints_total{{{JOB}}}[{RATE}]))",
                          "saved {{type}}"),
                        q(f"sum by (type) (increase(flatshard_checkpoint_failures_total{{{JOB}}}"
                          f"[{RATE}]))", "failed {{type}}")]),
        ],
    },
    "control-plane": {
        "uid": "flatshard-control-plane",
        "title": "flatshard / Control plane",
        "description": "Coordinator and worker RPCs, command batch round trips, heartbeats",
        "panels": [
            timeseries("Batch round trip by kind", "s",
                       quantiles("flatshard_batch_round_trip_seconds", JOB, ["kind"]),
                       "Fan-out of a command batch to every rank until the last result"),
            timeseries("RPC latency (coordinator)", "s",
                       quantiles("flatshard_rpc_duration_seconds", 'job="flatshard-coordinator"',
                                 ["method"])),
            timeseries("RPC latency (workers)", "s",
                       quantiles("flatshard_rpc_duration_seconds", 'job="flatshard-worker"',
                                 ["method"])),
            timeseries("RPCs by status code", "reqps",
                       [q(f"sum by (job, code) (rate(flatshard_rpc_duration_seconds_count[{RATE}]))",
                          "{{job}} {{code}}")]),
            timeseries("Heartbeat age by rank", "s",
                       [q(f"flatshard_worker_heartbeat_age_seconds{{{JOB_RANK}}}", "rank {{rank}}")],
                       "Past the coordinator's heartbeat timeout the rank is failed"),
            timeseries("Last completed seq by rank", "none",
                       [q(f"flatshard_worker_last_completed_seq{{{JOB_RANK}}}", "rank {{rank}}")],
                       "A rank that stays behind the others is stuck (FlatshardRankStuck)"),
            timeseries("Workers", "none",
                       [q(f"sum(flatshard_worker_up{{{JOB}}})", "up (in the job)"),
                        q("sum(flatshard_workers_registered)", "registered"),
                        q('sum(up{job="flatshard-worker"})', "scraped")]),
            timeseries("Scrape duration", "s",
                       [q('scrape_duration_seconds{job=~"flatshard-.*"}', "{{job}} {{instance}}")]),
        ],
    },
}


def layout(panels):
    """Assigns ids and grid positions, left to right, in rows of 24 units."""
    x = y = row_height = 0
    out = []
    for i, panel in enumerate(panels, start=1):
        panel = dict(panel)
        width = panel.pop("width")
        height = 4 if panel["type"] == "stat" else 8
        if x + width > 24:
            x, y, row_height = 0, y + row_height, 0
        panel["id"] = i
        panel["gridPos"] = {"h": height, "w": width, "x": x, "y": y}
        panel["datasource"] = DS
        panel["targets"] = [dict(t, refId=chr(ord("A") + k), datasource=DS)
                            for k, t in enumerate(panel["targets"])]
        x += width
        row_height = max(row_height, height)
        out.append(panel)
    return out


def dashboard(spec):
    return {
        "uid": spec["uid"],
        "title": spec["title"],
        "description": spec["description"],
        "tags": ["flatshard"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 38,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "links": [{"type": "dashboards", "tags": ["flatshard"], "asDropdown": True,
                   "title": "flatshard", "includeVars": True, "keepTime": True}],
        "templating": {"list": VARIABLES},
        "annotations": {"list": []},
        "panels": layout(spec["panels"]),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="fail if a committed dashboard differs instead of writing")
    args = parser.parse_args()
    here = pathlib.Path(__file__).resolve().parent
    stale = []
    for name, spec in DASHBOARDS.items():
        path = here / f"{name}.json"
        text = json.dumps(dashboard(spec), indent=2, sort_keys=False) + "\n"
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
    if stale:
        print("generate.py: out of date: " + ", ".join(stale) +
              " (run dashboards/generate.py and commit the result)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
