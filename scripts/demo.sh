#!/usr/bin/env bash
# The main job, as far as flatshard goes today: installs dependencies, builds, and
# plans the example models as a 4- and 8-rank FSDP job (units, shard ranges,
# per-rank memory, bytes per collective). Local-cluster training and checkpoints
# on demand join this script as issues #3-#5 land.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh >/dev/null
bin=build/client/flatshard

echo "== GPT-style decoder, FULL_SHARD over 8 ranks, bf16 all-gathers, one unit per block =="
"$bin" plan --model examples/gpt-small.yaml --policy module-type:TransformerBlock \
  --world-size 8 --strategy FULL_SHARD --param-dtype bfloat16 | sed -n '1,6p;/^MEMORY/,$p'
echo
echo "== MLP, HYBRID_SHARD as 2 replicas x 2 shards, use_orig_params layout =="
"$bin" plan --model examples/mlp.yaml --policy module-type:Residual --world-size 4 \
  --strategy HYBRID_SHARD --hybrid-shard-size 2 --use-orig-params | sed -n '1,20p'
echo
echo "Next: '$bin plan --help' for every option; add --json for the machine-readable"
echo "form (docs/plan-json.md); examples/*.yaml and docs/model-spec.md for writing specs."
