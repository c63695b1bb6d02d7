#!/usr/bin/env bash
# The main job, as far as flatshard goes today: installs dependencies, builds,
# plans the example GPT as an 8-rank FSDP job, then trains the example MLP with 4
# real worker processes on this machine (FULL_SHARD, bf16 all-gathers, Gloo over
# loopback). The coordinator, `flatshard up` and checkpoints on demand join this
# script as issues #4 and #5 land.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh >/dev/null
bin=build/client/flatshard

echo "== GPT-style decoder, FULL_SHARD over 8 ranks, bf16 all-gathers, one unit per block =="
"$bin" plan --model examples/gpt-small.yaml --policy module-type:TransformerBlock \
  --world-size 8 --strategy FULL_SHARD --param-dtype bfloat16 | sed -n '1,6p;/^MEMORY/,$p'
echo
echo "== Training the 1M-parameter MLP: 4 worker processes, FULL_SHARD, bf16 all-gathers =="
OPENBLAS_NUM_THREADS=1 build/worker/flatshard-train-local --model examples/mlp.yaml \
  --policy module-type:Residual --world-size 4 --strategy FULL_SHARD --param-dtype bfloat16 \
  --optimizer adamw --lr 2e-3 --batch 64 --steps 60
echo
echo "Next: '$bin plan --help' and 'build/worker/flatshard-train-local --help' for every"
echo "option (strategies, hybrid groups, prefetch, no_sync, clipping); --json on plan for"
echo "the machine-readable form (docs/plan-json.md); docs/model-spec.md for writing specs."
