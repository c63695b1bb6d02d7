#!/usr/bin/env bash
# Runs a Python test of the client (client_test.py, torch_test.py) in the venv
# scripts/python-env.sh caches for REQUIREMENTS (under client/python); exits 77
# (ctest: skipped) only when Python or PyPI cannot be had.
#   run_in_venv.sh REQUIREMENTS TEST_SCRIPT BIN_DIR SOURCE_DIR WORK_DIR
set -euo pipefail
requirements=$1 script=$2 bin=$3 src=$4 work=$5
command -v python3 >/dev/null || { echo "python3 not found: skipped"; exit 77; }
venv=$(bash "$src/scripts/python-env.sh" "$src/client/python/$requirements") \
  || { echo "could not make the Python venv (PyPI unreachable?): skipped"; exit 77; }
rm -rf "$work" && mkdir -p "$work"
cd "$src/tests/python"
exec "$venv/bin/python" "$script" "$bin" "$src" "$work"
