#!/usr/bin/env bash
# Runs the real `flatshard` binary: a good plan exits 0 with the documented JSON,
# bad input exits non-zero with a message naming the file, the field and the
# problem. Usage: plan_cli_test.sh <flatshard binary> <source dir>
set -u
bin=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

expect() {  # expect <name> <want-exit:0|nonzero> <pattern> -- args...
  local name=$1 want=$2 pattern=$3
  shift 4
  "$bin" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [[ $want == 0 && $rc -ne 0 ]] || [[ $want == nonzero && $rc -eq 0 ]]; then
    echo "FAIL $name: exit $rc"; cat "$tmp/err"; failures=$((failures + 1)); return
  fi
  if ! grep -q -- "$pattern" "$tmp/out" "$tmp/err"; then
    echo "FAIL $name: output lacks '$pattern'"; cat "$tmp/out" "$tmp/err" | head -20
    failures=$((failures + 1)); return
  fi
  echo "ok   $name"
}

expect gpt_text 0 "COLLECTIVES PER STEP" -- plan --model "$src/examples/gpt-7m.yaml" \
  --policy module-type:TransformerBlock --world-size 8 --strategy FULL_SHARD
expect gpt_json 0 '"format": "flatshard.plan/v1"' -- plan --model "$src/examples/gpt-7m.yaml" \
  --policy module-type:TransformerBlock --world-size 8 --strategy FULL_SHARD --json
python3 -c "import json,sys; d=json.load(open('$tmp/out')); assert len(d['units'])==9, d['units']" \
  || { echo "FAIL gpt_json: not 9 units"; failures=$((failures + 1)); }
expect mlp_hybrid 0 "replicate" -- plan --model "$src/examples/mlp.yaml" \
  --policy module-type:Residual --world-size 4 --strategy HYBRID_SHARD --hybrid-shard-size 2

cat >"$tmp/bad.yaml" <<'YAML'
root:
  type: Sequential
  children:
    - name: fc
      type: Linear
      params: [{name: weight, shape: [3, -4]}]
YAML
expect bad_shape nonzero "bad.yaml:6: parameter 'fc.weight': shape\[1\] must be > 0, got -4" -- \
  plan --model "$tmp/bad.yaml"
expect missing_file nonzero "nope.yaml: cannot open the file" -- plan --model "$tmp/nope.yaml"
expect bad_strategy nonzero "unknown sharding strategy 'ZERO9'" -- \
  plan --model "$src/examples/mlp.yaml" --strategy ZERO9
expect bad_policy nonzero "unknown module type 'Block'" -- \
  plan --model "$src/examples/mlp.yaml" --policy module-type:Block
expect bad_hybrid nonzero "does not divide the world size 6" -- \
  plan --model "$src/examples/mlp.yaml" --world-size 6 --strategy HYBRID_SHARD --hybrid-shard-size 4
expect tied_split nonzero "tied parameters must be in one unit" -- \
  plan --model "$src/examples/gpt-7m.yaml" --policy module-type:Linear --world-size 2
expect help 0 "--world-size" -- plan --help
expect job_file 0 "strategy FULL_SHARD over 4 ranks" -- plan --job "$src/examples/mlp-job.yaml"
expect no_model nonzero "--model or --job is required" -- plan
expect both nonzero "excludes" -- plan --model "$src/examples/mlp.yaml" --job "$src/examples/mlp-job.yaml"
"$bin" plan >/dev/null 2>&1; rc=$?
[[ $rc -eq 2 ]] || { echo "FAIL usage_exit_code: $rc, want 2"; failures=$((failures + 1)); }
expect top_help 0 "Exit codes" -- --help

echo "$((16 - failures)) passed, $failures failed"
[[ $failures -eq 0 ]]
