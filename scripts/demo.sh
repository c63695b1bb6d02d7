#!/usr/bin/env bash
# The main job: installs dependencies, builds, starts a local cluster (a
# coordinator and 4 CPU worker daemons), creates the example job (the 1M-parameter
# MLP, FULL_SHARD with bf16 all-gathers), trains it through the coordinator with
# live progress while a second client takes a checkpoint on demand in the middle
# of training, shows how to resume from it, gathers the trained parameters into
# a safetensors file, and stops the cluster. A Prometheus server scrapes every
# daemon meanwhile; the demo ends with what it saw. The cluster runs secured
# (`flatshard up --tls`: mutual TLS on every channel, an admin token, an audit
# log); FLATSHARD_DEMO_TLS=0 runs it plaintext on loopback instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh >/dev/null
bin=build/bin/flatshard
out=${FLATSHARD_DEMO_DIR:-$(mktemp -d -t flatshard-demo.XXXXXX)}
mkdir -p "$out"

echo "== A GPT-style decoder planned as an 8-rank FULL_SHARD job (no cluster needed) =="
"$bin" plan --model examples/gpt-small.yaml --policy module-type:TransformerBlock \
  --world-size 8 --strategy FULL_SHARD --param-dtype bfloat16 |
  awk 'NR <= 6 || (!memory && /^[0-9]/) { print } /^MEMORY/ { memory = 1 } memory { print }'
echo

echo "== flatshard up: a coordinator, 4 workers and Prometheus, then the job from examples/mlp-job.yaml =="
export OPENBLAS_NUM_THREADS=1
tls=()
[[ ${FLATSHARD_DEMO_TLS:-1} == 1 ]] && tls=(--tls)
"$bin" up "${tls[@]}" --workers 4 --listen 127.0.0.1:0 --job examples/mlp-job.yaml \
  --address-file "$out/coordinator" --checkpoint-dir "$out/checkpoints" \
  --prometheus --prometheus-listen 127.0.0.1:0 --scrape-interval 1 >"$out/up.log" 2>&1 &
up_pid=$!
trap 'kill -TERM $up_pid 2>/dev/null || true; wait $up_pid 2>/dev/null || true' EXIT
# `up` writes the address file once every worker is up and the job is READY.
for _ in $(seq 1200); do
  [[ -s "$out/coordinator" ]] && break
  kill -0 "$up_pid" 2>/dev/null || { cat "$out/up.log"; exit 1; }
  sleep 0.1
done
[[ -s "$out/coordinator" ]] || { echo "flatshard up did not come up; see $out/up.log"; exit 1; }
addr=$(cat "$out/coordinator")
if ((${#tls[@]})); then
  # The admin client's certificate and token, as `up` printed them.
  security=$out/checkpoints/.security
  export FLATSHARD_TLS_CERT=$security/admin.pem FLATSHARD_TLS_KEY=$security/admin-key.pem \
    FLATSHARD_TLS_CA=$security/ca.pem FLATSHARD_TOKEN_FILE=$security/admin.token
fi
prometheus=$(sed -n 's/^prometheus: \([^ ]*\).*/\1/p' "$out/up.log")
sed -n '1,/Ctrl-C stops/p' "$out/up.log" | grep -v '^\[' | sed 's/^/  /'
echo

echo "== flatshard train: 60 steps through the coordinator; at step 30 a second client asks for a checkpoint =="
# The second client: once the job reports step 30, `ckpt save` runs between two
# steps of the training the first client is streaming.
(
  for _ in $(seq 600); do
    step=$("$bin" job status -c "$addr" -j mlp-demo --json | sed -n 's/.*"step": *"\{0,1\}\([0-9]*\).*/\1/p')
    [[ -n "$step" && "$step" -ge 30 ]] && break
    sleep 0.05
  done
  "$bin" ckpt save -c "$addr" -j mlp-demo -n mid-training -t sharded >"$out/ckpt-save.log" 2>&1
) &
saver=$!
"$bin" train -c "$addr" -j mlp-demo --steps 60
wait $saver || { cat "$out/ckpt-save.log"; exit 1; }
echo
echo "== the checkpoint taken mid-training (flatshard ckpt ls / verify) =="
sed 's/^/  /' "$out/ckpt-save.log"
"$bin" ckpt ls -c "$addr" -j mlp-demo
"$bin" ckpt verify "$out/checkpoints/mlp-demo/mid-training" | tail -1
echo
echo "== resume: load it (every rank stages, then all apply) and train on from its step =="
"$bin" ckpt load -c "$addr" -j mlp-demo mid-training
"$bin" train -c "$addr" -j mlp-demo --steps 5
echo
"$bin" workers -c "$addr"
echo
echo "== flatshard summon: the trained model, gathered unit by unit =="
"$bin" summon -c "$addr" -j mlp-demo --out "$out/mlp-demo.safetensors"
echo
echo "== what Prometheus ($prometheus) scraped: dashboards/ and docs/observability.md show the rest =="
# Prometheus starts scraping new targets a few seconds after it starts and
# then every second: wait (bounded) until it has seen the last step.
python3 - "$prometheus" "$("$bin" job status -c "$addr" -j mlp-demo --json | sed -n 's/.*"step": *"\{0,1\}\([0-9]*\).*/\1/p')" <<'PY' || true
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

kill -TERM "$up_pid"
wait "$up_pid" || true
trap - EXIT
grep -A2 'stopping the cluster' "$out/up.log" | sed 's/^/  /' || true
if ((${#tls[@]})); then
  echo
  echo "== the audit log: every state-changing call, who made it and how it ended =="
  sed 's/^audit time=[^ ]* /  /' "$security/audit.log" | head -12
fi
echo
echo "Next: run 'build/bin/flatshard up' in one terminal and drive it from another"
echo "(flatshard job create -f examples/mlp-job.yaml; flatshard train -j mlp-demo --steps 50;"
echo "flatshard ckpt save|load|ls; unshard/reshard/summon/watch); offline, with no cluster:"
echo "flatshard ckpt inspect|verify|consolidate|reshard on $out/checkpoints/mlp-demo/mid-training."
echo "'build/bin/flatshard --help' lists every command; docs/checkpoints.md, docs/job-spec.md and"
echo "docs/control-plane.md explain checkpoints, the job file and how the coordinator drives workers."
echo "'flatshard up --prometheus' runs Prometheus beside the cluster; import dashboards/*.json into"
echo "Grafana (dashboards/provisioning/) and see docs/observability.md for every metric and alert."
echo "Outputs are in $out."
