#!/usr/bin/env bash
# Runs the real daemons' device flags: on a machine without a visible GPU,
# `--device cuda` exits 2 before registering, saying no CUDA device is visible;
# bad device flags exit 2 naming the flag; --compute-threads sizes the CPU
# device's GEMM thread pool; a bad --log-level is refused by both daemons. Usage:
#   worker_device_cli_test.sh <bin dir>
# Exits 77 (skipped) on a machine where a GPU is visible.
set -u
bin=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# A worker that gets as far as registering claims a seat in its --state-dir
# (default ./flatshard-worker-state): in $tmp, not where the test was started.
cd "$tmp" || exit 1
failures=0

expect() {  # expect <name> <want-exit> <pattern> -- command...
  local name=$1 want=$2 pattern=$3
  shift 4
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [[ $rc -ne $want ]]; then
    echo "FAIL $name: exit $rc, want $want"; cat "$tmp/out" "$tmp/err" | head -20
    failures=$((failures + 1)); return
  fi
  if ! grep -q -- "$pattern" "$tmp/out" "$tmp/err"; then
    echo "FAIL $name: output lacks '$pattern'"; cat "$tmp/out" "$tmp/err" | head -20
    failures=$((failures + 1)); return
  fi
  echo "ok   $name"
}

# Nothing listens on port 1: a worker that got past its device check would
# fail to register instead, with another message and exit code.
coordinator=127.0.0.1:1

expect bad_kind 2 "unknown device kind 'tpu'" -- \
  "$bin/flatshard-worker" --device tpu --coordinator $coordinator
expect bad_comm 2 "\-\-comm" -- \
  "$bin/flatshard-worker" --device cpu --comm mpi --coordinator $coordinator
expect nccl_on_cpu 2 "\-\-comm" -- \
  "$bin/flatshard-worker" --device cpu --comm nccl --coordinator $coordinator
expect gpu_without_cuda 2 "only meaningful with --device cuda" -- \
  "$bin/flatshard-worker" --device sim --gpu 1 --coordinator $coordinator
expect negative_gpu 105 "\-\-gpu" -- \
  "$bin/flatshard-worker" --device cuda --gpu -3 --coordinator $coordinator
# GEMM threads: the flag sets OpenBLAS's pool over the environment's choice,
# which holds without it; the worker logs the count before it registers (and
# then fails to: nothing listens). A negative count is refused by name.
expect compute_threads_flag 1 "kernels (.*) on 1 thread(s)" -- \
  env OPENBLAS_NUM_THREADS=2 "$bin/flatshard-worker" --device cpu --compute-threads 1 \
  --coordinator $coordinator --connect-timeout 1
expect compute_threads_env 1 "kernels (.*) on 2 thread(s)" -- \
  env OPENBLAS_NUM_THREADS=2 "$bin/flatshard-worker" --device cpu \
  --coordinator $coordinator --connect-timeout 1
expect negative_compute_threads 105 "\-\-compute-threads: Value -1 not in range" -- \
  "$bin/flatshard-worker" --compute-threads -1 --coordinator $coordinator
expect up_negative_compute_threads 2 "\-\-compute-threads: Value -2 not in range" -- \
  "$bin/flatshard" up --compute-threads -2
# Both daemons refuse a log level they do not know, from the flag or its env.
expect worker_bad_log_level 105 "\-\-log-level: loud not in" -- \
  "$bin/flatshard-worker" --log-level loud --coordinator $coordinator
expect coordinator_bad_log_level_env 105 "\-\-log-level: loud not in" -- \
  env FLATSHARD_LOG_LEVEL=loud "$bin/flatshard-coordinator" --listen 127.0.0.1:0

if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "a GPU is visible here: the no-GPU refusals are not testable (scripts/gpu-check.sh runs the GPU tests)"
  ((failures == 0)) || exit 1
  exit 77
fi
expect worker_no_gpu 2 "no CUDA device is visible" -- \
  "$bin/flatshard-worker" --device cuda --coordinator $coordinator
expect worker_hidden_gpus 2 "no CUDA device is visible" -- \
  env CUDA_VISIBLE_DEVICES= "$bin/flatshard-worker" --device cuda --coordinator $coordinator
expect train_local_no_gpu 2 "no CUDA device is visible" -- \
  "$bin/flatshard-train-local" --device cuda --model "$here/../../examples/mlp.yaml"

((failures == 0)) || { echo "$failures failure(s)"; exit 1; }
