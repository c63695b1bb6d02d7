#!/usr/bin/env bash
# The main job: installs dependencies, builds the daemons and the CLI, turns the
# licenses Debian ships (/usr/share/common-licenses) into byte tokens, starts a
# local cluster (a coordinator and 4 CPU worker daemons) and trains the
# byte-level GPT of examples/gpt-job.yaml through the coordinator with live
# progress, while a second client takes a checkpoint on demand mid-training.
# Then: the validation loss at both checkpoints, a resume from the mid-training
# one, text sampled from the trained model (`flatshard generate`), the Python
# client on the same cluster writing a loss-curve PNG, and what Prometheus saw.
# The cluster runs secured (`flatshard up --tls`: mutual TLS on every channel,
# an admin token, an audit log); FLATSHARD_DEMO_TLS=0 runs it plaintext on
# loopback. FLATSHARD_DEMO_STEPS (default 800) sets the training length.
set -euo pipefail
case "${1:-}" in
  "") ;;
  -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "demo.sh: unknown argument '$1' (it takes none; try --help)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== building the daemons and the CLI (bash scripts/test.sh builds and runs everything) =="
bash scripts/build.sh flatshard flatshard-coordinator flatshard-worker >/dev/null
bin=build/bin/flatshard
out=${FLATSHARD_DEMO_DIR:-$(mktemp -d -t flatshard-demo.XXXXXX)}
mkdir -p "$out"
steps=${FLATSHARD_DEMO_STEPS:-800}
mid=$((steps / 2))
job=gpt-demo
# The Python client's venv (grpcio, numpy, matplotlib; cached) is made while the
# cluster trains.
bash scripts/python-env.sh client/python/requirements-demo.txt >"$out/venv" 2>"$out/venv.log" &
venv_pid=$!

echo "== the GPT planned as an 8-rank FULL_SHARD job (no cluster needed) =="
"$bin" plan --model examples/gpt-small.yaml --policy module-type:TransformerBlock \
  --world-size 8 --strategy FULL_SHARD --param-dtype bfloat16 |
  awk 'NR <= 6 || (!memory && /^[0-9]/) { print } /^MEMORY/ { memory = 1 } memory { print }'
echo

echo "== the data: the software licenses of Debian's base-files package, as byte tokens =="
licenses=()
for f in GPL-3 GPL-2 GPL-1 LGPL-2.1 LGPL-2 LGPL-3 GFDL-1.3 GFDL-1.2 Apache-2.0 MPL-2.0 \
    MPL-1.1 Artistic CC0-1.0 BSD; do
  licenses+=("/usr/share/common-licenses/$f")
done
"$bin" data prepare-text "${licenses[@]}" -o "$out/data/gpt-text" --seq-len 64 --squeeze-spaces |
  tail -1
echo

echo "== flatshard up: a coordinator, 4 workers and Prometheus, then the job from examples/gpt-job.yaml =="
export OPENBLAS_NUM_THREADS=1
tls=()
[[ ${FLATSHARD_DEMO_TLS:-1} == 1 ]] && tls=(--tls)
# shellcheck source=scripts/lib/flatshard_up.sh
source scripts/lib/flatshard_up.sh
# Sets $up and $addr once every worker is up and the job is READY.
start_flatshard_up "$bin" "$out" "${tls[@]}" --workers 4 --job examples/gpt-job.yaml \
  --data-dir "$out/data" --checkpoint-dir "$out/checkpoints" \
  --prometheus --prometheus-listen 127.0.0.1:0 --scrape-interval 1
if ((${#tls[@]})); then
  # The admin client's certificate and token, as `up` printed them.
  security=$out/checkpoints/.security
  export FLATSHARD_TLS_CERT=$security/admin.pem FLATSHARD_TLS_KEY=$security/admin-key.pem \
    FLATSHARD_TLS_CA=$security/ca.pem FLATSHARD_TOKEN_FILE=$security/admin.token
fi
prometheus=$(sed -n 's/^prometheus: \([^ ]*\).*/\1/p' "$out/up.log")
sed -n '1,/Ctrl-C stops/p' "$out/up.log" | grep -v '^\[' | sed 's/^/  /'
echo

job_step() {
  "$bin" job status -c "$addr" -j "$job" --json | sed -n 's/.*"step": *"\{0,1\}\([0-9]*\).*/\1/p'
}
echo "== flatshard train: $steps steps through the coordinator; at step $mid a second client asks for a checkpoint =="
# The second client: once the job reports step $mid, `ckpt save` runs between
# two steps of the training the first client is streaming.
(
  for _ in $(seq 6000); do
    step=$(job_step)
    [[ -n "$step" && "$step" -ge $mid ]] && break
    sleep 0.05
  done
  "$bin" ckpt save -c "$addr" -j "$job" -n mid-training -t sharded >"$out/ckpt-save.log" 2>&1
) &
saver=$!
"$bin" train -c "$addr" -j "$job" --steps "$steps" --log "$out/train.jsonl"
wait $saver || { cat "$out/ckpt-save.log"; exit 1; }
"$bin" ckpt save -c "$addr" -j "$job" -n final -t sharded >/dev/null
echo
echo "== the checkpoints (flatshard ckpt ls / verify) and the held-out validation loss at each =="
sed 's/^/  /' "$out/ckpt-save.log"
"$bin" ckpt ls -c "$addr" -j "$job"
"$bin" ckpt verify "$out/checkpoints/$job/mid-training" | tail -1
validation=()
for name in mid-training final; do
  dir=$out/checkpoints/$job/$name
  at=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["step"])' "$dir/manifest.json")
  line=$("$bin" eval --checkpoint "$dir" --data "$out/data/gpt-text/val")
  echo "  $name (step $at): $line"
  validation+=("$at:$(awk '{ print $2 }' <<<"$line")")
done
echo
echo "== flatshard generate: bytes sampled from the trained model (offline, the workers' own layers) =="
"$bin" generate --checkpoint "$out/checkpoints/$job/final" --prompt "This License" \
  --tokens 300 --temperature 0.7 --seed 1 | sed 's/^/  | /'
echo
echo "== resume: load the mid-training checkpoint (every rank stages, then all apply) and train on =="
"$bin" ckpt load -c "$addr" -j "$job" mid-training
"$bin" train -c "$addr" -j "$job" --steps 5
echo
"$bin" workers -c "$addr"
echo
echo "== the Python client (client/python) on the same cluster, and the loss curve =="
wait $venv_pid || { cat "$out/venv.log"; exit 1; }
"$(cat "$out/venv")/bin/python" scripts/demo_client.py "$addr" "$job" "$out/train.jsonl" \
  "$out/loss.png" "${validation[@]}"
echo
echo "== what Prometheus ($prometheus) scraped: dashboards/ and docs/observability.md show the rest =="
# Prometheus starts scraping new targets a few seconds after it starts and
# then every second: wait (bounded) until it has seen the last step.
python3 - "$prometheus" "$(job_step)" <<'PY' || true
import json, sys, time, urllib.parse, urllib.request
base, step = sys.argv[1], sys.argv[2]
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": "flatshard_job_step"})
    result = json.load(urllib.request.urlopen(url, timeout=10))["data"]["result"]
    if result and result[0]["value"][1] == step:
        break
    time.sleep(0.5)
PY
for q in 'flatshard_job_step' 'flatshard_loss' \
    'sum by (op) (rate(flatshard_collective_bus_bytes_total[1m])) / sum by (op) (rate(flatshard_collective_duration_seconds_sum[1m])) > 0' \
    'max by (kind) (flatshard_memory_peak_bytes)' 'flatshard_checkpoints_total > 0'; do
  python3 - "$prometheus" "$q" <<'PY' || true
import json, sys, urllib.parse, urllib.request
base, query = sys.argv[1], sys.argv[2]
url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": query})
result = json.load(urllib.request.urlopen(url, timeout=10))["data"]["result"]
print(f"  {query}")
for r in result:
    labels = ",".join(f"{k}={v}" for k, v in r["metric"].items()
                      if k in ("op", "kind", "type", "job_name"))
    print(f"      {labels or '-':<32} {float(r['value'][1]):.4g}")
PY
done
echo

kill -TERM "$up"
wait "$up" || true
trap - EXIT
grep -A2 'stopping the cluster' "$out/up.log" | sed 's/^/  /' || true
if ((${#tls[@]})); then
  echo
  echo "== the audit log: every state-changing call, who made it, when a stream started, how it ended =="
  sed 's/^audit time=[^ ]* /  /' "$security/audit.log" | head -16
fi
echo
echo "Next: run 'build/bin/flatshard up' in one terminal and drive it from another"
echo "(flatshard job create -f examples/mlp-job.yaml; flatshard train -j mlp-demo --steps 50;"
echo "flatshard ckpt save|load|ls; unshard/reshard/summon/watch), or from Python"
echo "(pip install ./client/python; docs/python.md). Offline, with no cluster: flatshard"
echo "ckpt inspect|verify|consolidate|reshard, eval and generate on $out/checkpoints/$job/final."
echo "'build/bin/flatshard --help' lists every command; docs/checkpoints.md, docs/job-spec.md and"
echo "docs/control-plane.md explain checkpoints, the job file and how the coordinator drives workers."
echo "'flatshard up --prometheus' runs Prometheus beside the cluster; import dashboards/*.json into"
echo "Grafana (dashboards/provisioning/) and see docs/observability.md for every metric and alert."
echo "Outputs are in $out."
