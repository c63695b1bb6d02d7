#!/usr/bin/env python3
"""Static checks of dashboards/: the committed JSON is what generate.py
writes; the five dashboards have distinct, stable uids; each has the
datasource, job and rank variables; every panel and target reads through the
datasource variable and has a PromQL expression; the provisioning files
name the dashboards' directory. (prometheus_test.py evaluates the
expressions against a live Prometheus.)

    dashboards_test.py SOURCE_DIR
"""
import json
import pathlib
import subprocess
import sys

UIDS = {
    "overview.json": "flatshard-overview",
    "collectives.json": "flatshard-collectives",
    "memory.json": "flatshard-memory",
    "checkpoints.json": "flatshard-checkpoints",
    "control-plane.json": "flatshard-control-plane",
}
DS = {"type": "prometheus", "uid": "${datasource}"}


def main():
    source = pathlib.Path(sys.argv[1])
    boards = source / "dashboards"
    failures = []
    check = subprocess.run([sys.executable, str(boards / "generate.py"), "--check"],
                           capture_output=True, text=True)
    if check.returncode != 0:
        failures.append(check.stderr.strip())

    found = {p.name: json.loads(p.read_text()) for p in sorted(boards.glob("*.json"))}
    if set(found) != set(UIDS):
        failures.append(f"dashboards {sorted(found)}, expected {sorted(UIDS)}")
    for name, board in found.items():
        where = name
        if board.get("uid") != UIDS.get(name):
            failures.append(f"{where}: uid {board.get('uid')} (dashboards are linked by uid; "
                            f"it must stay {UIDS.get(name)})")
        variables = {v["name"]: v for v in board["templating"]["list"]}
        if variables.get("datasource", {}).get("type") != "datasource":
            failures.append(f"{where}: no datasource variable")
        for var in ("job_name", "rank"):
            if var not in variables or variables[var].get("datasource") != DS:
                failures.append(f"{where}: no {var} variable reading through $datasource")
        if not variables.get("rank", {}).get("includeAll"):
            failures.append(f"{where}: the rank variable must offer All")
        ids, titles = set(), set()
        for panel in board["panels"]:
            title = panel.get("title", "")
            if panel["id"] in ids or title in titles:
                failures.append(f"{where}: duplicate panel id or title '{title}'")
            ids.add(panel["id"])
            titles.add(title)
            if panel.get("datasource") != DS:
                failures.append(f"{where}: '{title}' does not use $datasource")
            if not panel.get("targets"):
                failures.append(f"{where}: '{title}' has no queries")
            for target in panel.get("targets", []):
                if target.get("datasource") != DS or not target.get("expr", "").strip():
                    failures.append(f"{where}: '{title}' {target.get('refId')}: no expr or "
                                    "not through $datasource")
            pos = panel.get("gridPos", {})
            if pos.get("x", 0) + pos.get("w", 0) > 24:
                failures.append(f"{where}: '{title}' is wider than the grid")

    provider = (boards / "provisioning/dashboards/flatshard.yml").read_text()
    datasource = (boards / "provisioning/datasources/flatshard.yml").read_text()
    if "type: file" not in provider or "path:" not in provider:
        failures.append("provisioning/dashboards/flatshard.yml: no file provider with a path")
    if "type: prometheus" not in datasource:
        failures.append("provisioning/datasources/flatshard.yml: no Prometheus datasource")

    if failures:
        print("\n".join(failures))
        return 1
    print(f"dashboards_test: {len(found)} dashboards, "
          f"{sum(len(b['panels']) for b in found.values())} panels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
