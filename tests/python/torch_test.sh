#!/usr/bin/env bash
# The PyTorch interop tests (tests/python/torch_test.py) in the cached torch venv
# (scripts/python-env.sh; torch from PyPI, ~3 GB once); exits 77 (ctest:
# skipped) only when Python or PyPI cannot be had.
#   torch_test.sh BIN_DIR SOURCE_DIR WORK_DIR
set -euo pipefail
bin=$1 src=$2 work=$3
command -v python3 >/dev/null || { echo "python3 not found: skipped"; exit 77; }
venv=$(bash "$src/scripts/python-env.sh" "$src/client/python/requirements-torch.txt") \
  || { echo "could not make the Python venv (PyPI unreachable?): skipped"; exit 77; }
rm -rf "$work" && mkdir -p "$work"
cd "$src/tests/python"
exec "$venv/bin/python" torch_test.py "$bin" "$src" "$work"
