#!/usr/bin/env bash
# `flatshard data prepare-text`, `flatshard eval` and `flatshard generate`
# against a real local cluster (issue #13 §3): the token files have the shapes
# and bytes of the text; a GPT trains on them; `eval` of the next global batch
# reproduces the loss the cluster reports for that step (the CLI runs the
# workers' own layers); a checkpoint and a summoned file give the same loss;
# sampling is reproducible by seed; bad input is refused naming what is wrong.
#   text_model_cli_test.sh BIN_DIR SOURCE_DIR WORK_DIR
set -euo pipefail
bin=$1 src=$2 work=$3
flatshard=$bin/flatshard
rm -rf "$work" && mkdir -p "$work"
venv=$(bash "$src/scripts/python-env.sh" "$src/client/python/requirements-test.txt") \
  || { echo "could not make the Python venv (PyPI unreachable?): skipped"; exit 77; }
py=$venv/bin/python
fail() { echo "FAIL: $*" >&2; exit 1; }
# shellcheck source=scripts/lib/flatshard_up.sh
source "$src/scripts/lib/flatshard_up.sh"

# expect CODE PATTERN -- ARGS...: exit code and a pattern in the output.
expect() {
  local code=$1 pattern=$2; shift 3
  local out rc=0
  out=$("$flatshard" "$@" 2>&1) || rc=$?
  [[ $rc == "$code" ]] || fail "flatshard $* exited $rc, expected $code: $out"
  grep -qF -- "$pattern" <<<"$out" || fail "flatshard $* did not say '$pattern': $out"
}

text=$src/docs/fsdp-semantics.md
data=$work/data/text
"$flatshard" data prepare-text "$text" "$src/README.md" -o "$data" --seq-len 32 \
  --validation-fraction 0.2 --squeeze-spaces >"$work/prepare.log"
grep -q "train [0-9]* windows of 32" "$work/prepare.log" || fail "$(cat "$work/prepare.log")"
"$py" - "$data" "$text" "$src/README.md" <<'PY'
import sys
import numpy as np
data, *files = sys.argv[1:]
import re
text = b""
for f in files:
    t = open(f, "rb").read()
    if text and not text.endswith(b"\n"):
        text += b"\n"
    text += t
text = re.sub(rb"[ \t]+", b" ", text)
train = int(len(text) * 0.8)
for split, part in (("train", text[:train]), ("val", text[train:])):
    x, y = np.load(f"{data}/{split}/inputs.npy"), np.load(f"{data}/{split}/labels.npy")
    assert x.dtype == np.int32 and x.shape == y.shape and x.shape[1] == 32, (x.dtype, x.shape)
    assert x.shape[0] == (len(part) - 1) // 32, (split, x.shape, len(part))
    stream = np.frombuffer(part, dtype=np.uint8)
    assert (x.reshape(-1) == stream[: x.size]).all(), f"{split}: inputs are not the text's bytes"
    assert (y.reshape(-1) == stream[1 : x.size + 1]).all(), f"{split}: labels are not shifted"
print("prepare-text: windows are the text's bytes, labels one byte later")
PY

expect 2 "too few for one window" -- data prepare-text "$src/.clang-format" -o "$work/x" --seq-len 100000
expect 2 "--validation-fraction must be in (0, 0.5]" -- \
  data prepare-text "$text" -o "$work/x" --validation-fraction 0.9
expect 2 "--seq-len must be > 0" -- data prepare-text "$text" -o "$work/x" --seq-len 0
expect 2 "File does not exist" -- data prepare-text "$work/no-such-file" -o "$work/x"

# A small GPT on the tokens, trained by a real cluster.
cat >"$work/gpt.yaml" <<'YAML'
name: tiny-gpt
root:
  type: GPT
  children:
    - {name: wte, type: Embedding, num_embeddings: 256, embedding_dim: 32}
    - {name: wpe, type: Embedding, num_embeddings: 32, embedding_dim: 32}
    - name: h
      repeat: 2
      template:
        type: TransformerBlock
        children:
          - {name: ln_1, type: LayerNorm, normalized_shape: 32}
          - name: attn
            type: CausalSelfAttention
            attrs: {num_heads: "2"}
            children:
              - {name: c_attn, type: Linear, in_features: 32, out_features: 96}
              - {name: c_proj, type: Linear, in_features: 32, out_features: 32}
          - {name: ln_2, type: LayerNorm, normalized_shape: 32}
          - name: mlp
            type: MLP
            children:
              - {name: c_fc, type: Linear, in_features: 32, out_features: 128}
              - {name: act, type: GELU, attrs: {approximate: tanh}}
              - {name: c_proj, type: Linear, in_features: 128, out_features: 32}
    - {name: ln_f, type: LayerNorm, normalized_shape: 32}
    - {name: lm_head, type: Linear, in_features: 32, out_features: 256, bias: false}
tied:
  - {alias: lm_head.weight, primary: wte.weight}
YAML
cat >"$work/job.yaml" <<'YAML'
name: text
model: gpt.yaml
wrap_policy: module-type:TransformerBlock
world_size: 2
optimizer: {kind: adamw, lr: 0.003}
data: {kind: file, path: text/train, global_batch_size: 8, sequence_length: 32}
YAML
export OPENBLAS_NUM_THREADS=1
start_flatshard_up "$flatshard" "$work" --workers 2 --job "$work/job.yaml" \
  --data-dir "$work/data" --checkpoint-dir "$work/ckpt"
"$flatshard" train -c "$addr" -j text --steps 40 --log "$work/train.jsonl" >/dev/null
"$flatshard" ckpt save -c "$addr" -j text -n full40 -t full >/dev/null
"$flatshard" ckpt save -c "$addr" -j text -n sharded40 -t sharded >/dev/null
"$flatshard" summon -c "$addr" -j text --out "$work/summoned.safetensors" >/dev/null
"$flatshard" train -c "$addr" -j text --steps 1 --log "$work/train.jsonl" >/dev/null
stop_flatshard_up
[[ $(wc -l <"$work/train.jsonl") == 41 ]] || fail "train --log wrote $(wc -l <"$work/train.jsonl") lines"

# Step 41 ran on global batch 40: windows (40*8 + i) mod N. Its loss is the
# mean over those tokens, which `eval` computes from the step-40 weights.
"$py" - "$data/train" "$work/next-batch" <<'PY'
import os, sys
import numpy as np
src, dst = sys.argv[1:]
os.makedirs(dst)
for name in ("inputs", "labels"):
    a = np.load(f"{src}/{name}.npy")
    np.save(f"{dst}/{name}.npy", a[[(40 * 8 + i) % len(a) for i in range(8)]])
PY
cluster_loss=$("$py" -c 'import json, sys; print([json.loads(l) for l in open(sys.argv[1])][-1]["loss"])' \
  "$work/train.jsonl")
for source in "--checkpoint $work/ckpt/text/full40" "--checkpoint $work/ckpt/text/sharded40" \
    "--model $work/gpt.yaml --weights $work/summoned.safetensors"; do
  # shellcheck disable=SC2086  # the source is two or four words
  line=$("$flatshard" eval $source --data "$work/next-batch")
  loss=$(awk '{ print $2 }' <<<"$line")
  "$py" -c 'import sys; a, b = map(float, sys.argv[1:]); assert abs(a - b) <= 1e-4 * b, (a, b)' \
    "$loss" "$cluster_loss" || fail "eval $source: $loss, the cluster reported $cluster_loss"
done
echo "eval reproduces the cluster's step-41 loss ($cluster_loss) from a FULL and a SHARDED checkpoint and a summoned file"

val=$("$flatshard" eval --checkpoint "$work/ckpt/text/full40" --data "$data/val")
awk '{ exit !($2 < 5.545) }' <<<"$val" || fail "validation loss not below ln(256): $val"

a=$("$flatshard" generate --checkpoint "$work/ckpt/text/full40" --prompt "The " -n 64 --seed 5)
b=$("$flatshard" generate --checkpoint "$work/ckpt/text/full40" --prompt "The " -n 64 --seed 5)
c=$("$flatshard" generate --checkpoint "$work/ckpt/text/full40" --prompt "The " -n 64 --seed 6)
[[ "$a" == "$b" ]] || fail "the same seed sampled different text"
[[ "$a" != "$c" ]] || fail "different seeds sampled the same text"
[[ $(printf '%s' "$a" | wc -c) -ge 68 && "$a" == "The "* ]] || fail "generate printed '$a'"

expect 2 "--temperature must be > 0" -- generate --checkpoint "$work/ckpt/text/full40" --temperature 0
expect 2 "--weights" -- generate --model "$work/gpt.yaml"
expect 2 "excludes" -- generate --checkpoint "$work/ckpt/text/full40" --model "$work/gpt.yaml" \
  --weights "$work/summoned.safetensors"
expect 2 "has no manifest.json" -- eval --checkpoint "$work/ckpt/text/never" --data "$data/val"
expect 2 "does not take token ids: not a language model" -- generate \
  --model "$src/examples/mlp.yaml" --weights "$work/summoned.safetensors"
echo "text_model_cli_test: passed"
