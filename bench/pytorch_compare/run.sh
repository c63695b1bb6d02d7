#!/usr/bin/env bash
# flatshard vs PyTorch FSDP1/FSDP2 side by side (compare.py), in the torch venv
# scripts/python-env.sh caches; needs build/bin (scripts/build.sh). Arguments go
# to compare.py (--help).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv=$(bash "$root/scripts/python-env.sh" "$root/client/python/requirements-torch.txt")
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
# Not cd'ed anywhere: --json and other paths are the caller's.
exec "$venv/bin/python" "$root/bench/pytorch_compare/compare.py" "$@"
