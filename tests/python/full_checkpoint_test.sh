#!/usr/bin/env bash
# A FULL checkpoint opens with the reference `safetensors` package (PyPI, with
# numpy) and its tensors equal what the cluster summons (issue #5). Installs
# both into a virtualenv under the build directory; exits 77 (ctest: skipped)
# only when Python or PyPI cannot be had.
#   full_checkpoint_test.sh BIN_DIR SOURCE_DIR WORK_DIR
set -euo pipefail
bin=$1 src=$2 work=$3
rm -rf "$work/run" && mkdir -p "$work/run"
run=$work/run
# shellcheck source=scripts/lib/flatshard_up.sh
source "$src/scripts/lib/flatshard_up.sh"

command -v python3 >/dev/null || { echo "python3 not found: skipped"; exit 77; }
venv=$work/pyenv
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c 'import safetensors, numpy' 2>/dev/null; then
  rm -rf "$venv"
  python3 -m venv "$venv" >/dev/null 2>&1 || { echo "python3 -m venv failed: skipped"; exit 77; }
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check safetensors numpy \
    || { echo "pip could not install safetensors numpy: skipped"; exit 77; }
fi

export OPENBLAS_NUM_THREADS=1
start_flatshard_up "$bin/flatshard" "$run" --workers 4 --job "$src/examples/mlp-job.yaml" \
  --checkpoint-dir "$run/ckpt"
"$bin/flatshard" train -c "$addr" -j mlp-demo --steps 3 >/dev/null
"$bin/flatshard" ckpt save -c "$addr" -j mlp-demo -n full3 -t full
"$bin/flatshard" summon -c "$addr" -j mlp-demo --out "$run/summoned.safetensors" >/dev/null
stop_flatshard_up

"$venv/bin/python" - "$run/ckpt/mlp-demo/full3" "$run/summoned.safetensors" <<'PY'
import json, sys
import numpy as np
from safetensors.numpy import load_file
from safetensors import safe_open

ckpt, summoned_path = sys.argv[1], sys.argv[2]
model = load_file(f"{ckpt}/model.safetensors")
summoned = load_file(summoned_path)
assert model.keys() == summoned.keys(), (sorted(model), sorted(summoned))
for name, value in model.items():
    assert value.dtype == summoned[name].dtype, name
    assert np.array_equal(value, summoned[name]), f"{name} differs from the summoned tensor"
optim = load_file(f"{ckpt}/optim.safetensors")
with safe_open(f"{ckpt}/optim.safetensors", framework="numpy") as f:
    groups = json.loads(f.metadata()["param_groups"])
assert set(groups[0]["params"]) >= set(model), "param_groups must list every FQN"
for name, value in model.items():
    if f"{name}.exp_avg" in optim:
        assert optim[f"{name}.exp_avg"].shape == value.shape, name
        assert optim[f"{name}.step"].shape == (), name
manifest = json.load(open(f"{ckpt}/manifest.json"))
assert manifest["state_dict_type"] == "FULL_STATE_DICT" and manifest["step"] == 3
print(f"safetensors {__import__('safetensors').__version__}: {len(model)} tensors equal the "
      f"summoned model; {len(optim)} optimizer tensors; lr {groups[0]['lr']}")
PY
