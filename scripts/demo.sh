#!/usr/bin/env bash
# The main job: installs dependencies, builds, starts a local cluster (a
# coordinator and 4 CPU worker daemons), creates the example job (the 1M-parameter
# MLP, FULL_SHARD with bf16 all-gathers), trains it through the coordinator with
# live progress, gathers the trained parameters into a safetensors file, and
# stops the cluster. Checkpoints on demand join with issue #5.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh >/dev/null
bin=build/bin/flatshard
out=${FLATSHARD_DEMO_DIR:-$(mktemp -d -t flatshard-demo.XXXXXX)}
mkdir -p "$out"

echo "== A GPT-style decoder planned as an 8-rank FULL_SHARD job (no cluster needed) =="
"$bin" plan --model examples/gpt-small.yaml --policy module-type:TransformerBlock \
  --world-size 8 --strategy FULL_SHARD --param-dtype bfloat16 | sed -n '1,6p;/^MEMORY/,$p'
echo

echo "== flatshard up: a coordinator and 4 workers, then the job from examples/mlp-job.yaml =="
export OPENBLAS_NUM_THREADS=1
coproc UP { exec "$bin" up --workers 4 --listen 127.0.0.1:0 --job examples/mlp-job.yaml \
  --address-file "$out/coordinator" --checkpoint-dir "$out/checkpoints" 2>&1; }
up_pid=$UP_PID
trap 'kill -TERM $up_pid 2>/dev/null || true; wait $up_pid 2>/dev/null || true' EXIT
while IFS= read -r line <&"${UP[0]}"; do
  echo "  $line"
  [[ $line == "The cluster is up"* ]] && break
done
addr=$(cat "$out/coordinator")
# Keep draining `up`'s output in the background so it never blocks on a full pipe.
cat <&"${UP[0]}" >"$out/up.log" &
echo

echo "== flatshard train: 60 steps through the coordinator =="
"$bin" train -c "$addr" -j mlp-demo --steps 60
echo
"$bin" workers -c "$addr"
echo
echo "== flatshard summon: the trained model, gathered unit by unit =="
"$bin" summon -c "$addr" -j mlp-demo --out "$out/mlp-demo.safetensors"
echo

kill -TERM "$up_pid"
wait "$up_pid" || true
trap - EXIT
sed -n '/stopping/,$p' "$out/up.log" | sed 's/^/  /'
echo
echo "Next: run 'build/bin/flatshard up' in one terminal and drive it from another"
echo "(flatshard job create -f examples/mlp-job.yaml; flatshard train -j mlp-demo --steps 50;"
echo "flatshard unshard/reshard/summon/watch); 'build/bin/flatshard --help' lists every command,"
echo "docs/job-spec.md the job file, docs/control-plane.md how the coordinator drives workers."
echo "Outputs are in $out."
