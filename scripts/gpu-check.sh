#!/usr/bin/env bash
# The GPU check: one command for a machine with NVIDIA GPUs. Builds with the CUDA
# path on, runs every CUDA test (each stream operation against the CPU device,
# NCCL on one rank, the equivalence suite on `cuda` with the ranks sharing the
# GPUs through --comm gloo, and over NCCL when there is a GPU per rank; checkpoints
# saved and loaded by GPU workers), then the
# collectives benchmark (runtime vs the bare NCCL call on the same bytes) and the
# training-step benchmark, and appends what it measured, with the GPU's name, to
# bench/RESULTS.md. Without a GPU it exits 3 and says so: a GPU number is never
# written unless it was measured on a GPU.
#
#   scripts/gpu-check.sh [--build-dir DIR] [--prebuilt DIR] [--results FILE] [--quick]
#                        [--log-dir DIR] [--step-timeout SECONDS]
#
#   --build-dir DIR   build here (default build-gpu/)
#   --prebuilt DIR    skip the build: DIR has bin/ (and lib/ for a bundle made by
#                     scripts/gpu-bundle.sh on a machine with the build
#                     dependencies); its tests run from there
#   --results FILE    append the results here (default bench/RESULTS.md)
#   --quick           fewer sizes and steps (a smoke check, still recorded)
#   --log-dir DIR     keep each step's log here (default: a fresh temporary folder)
#   --step-timeout S  stop a test or benchmark that runs longer (default 300): a
#                     hung collective fails its step instead of the whole check
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
build_dir="build-gpu"
prebuilt=""
results="$root/bench/RESULTS.md"
quick=0
log=""
step_timeout=300
while (($#)); do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --prebuilt) prebuilt="$(cd "$2" && pwd)"; shift 2 ;;
    --results) results="$2"; shift 2 ;;
    --quick) quick=1; shift ;;
    --log-dir) log="$2"; shift 2 ;;
    --step-timeout) step_timeout="$2"; shift 2 ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "gpu-check.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check.sh: no NVIDIA GPU is visible on this machine (nvidia-smi finds none);" \
       "nothing was measured or recorded" >&2
  exit 3
fi
mapfile -t gpu_lines < <(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader)
gpus=${#gpu_lines[@]}
gpu_name="${gpu_lines[0]%%,*}"
echo "gpu-check.sh: $gpus GPU(s): ${gpu_lines[*]}"

if [[ -n "$prebuilt" ]]; then
  bin="$prebuilt/bin"
  [[ -d "$prebuilt/lib" ]] && export LD_LIBRARY_PATH="$prebuilt/lib:${LD_LIBRARY_PATH:-}"
else
  bash scripts/setup.sh
  cmake -S . -B "$build_dir" -G Ninja -DFLATSHARD_CUDA=ON >/dev/null
  ninja -C "$build_dir" -j "$(nproc)"
  bin="$build_dir/bin"
fi
# cuBLAS is opened at run time; the toolkit's library directory must be findable.
for dir in /usr/local/cuda/lib64 /usr/local/cuda/lib; do
  [[ -d "$dir" ]] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$dir"
done
# NCCL and cuBLAS are not always installed beside the toolkit: a machine whose
# CUDA libraries came as Python wheels (nvidia-nccl-cu13, nvidia-cublas) has them
# under site-packages/nvidia/*/lib. The toolkit's copies, when present, come first.
for lib in libnccl.so.2 libcublas.so.13 libcublasLt.so.13; do
  ldconfig -p | grep -q "$lib" && continue
  found="$(find /usr/local/cuda/ /usr/lib /opt /usr/local/lib -name "$lib" 2>/dev/null | head -1 || true)"
  [[ -n "$found" ]] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:${found%/*}"
done
export LD_LIBRARY_PATH OPENBLAS_NUM_THREADS=1

[[ -n "$log" ]] || log="$(mktemp -d)/gpu-check"
mkdir -p "$log"
failed=0
run() {  # run NAME COMMAND...: logs, reports, and remembers a failure
  local name="$1"; shift
  echo "== $name"
  if timeout --kill-after=10 "$step_timeout" "$@" >"$log/$name.log" 2>&1; then
    echo "   ok"
  else
    echo "   FAILED (exit $?); log: $log/$name.log"
    tail -20 "$log/$name.log"
    failed=1
  fi
}

# Every stream operation on the GPU against the CPU device's result, events,
# the pool, pinned memory, argument errors.
run cuda_stream_test "$bin/cuda_stream_test"
# NCCL on one rank, and the refusal of every call after an abort.
run nccl_collectives_test "$bin/nccl_collectives_test"
# The equivalence suite on the GPU: ranks share the GPUs through staged Gloo,
# and use NCCL wherever every rank has a GPU of its own.
run cuda_equivalence "$bin/fsdp_equivalence_test" --gtest_filter='CudaDevice/*'
# Checkpoints from GPU workers (every rank on GPU 0 over staged Gloo): FULL,
# SHARDED and LOCAL saved, reloaded at other world sizes bit for bit, resumed
# exactly, damaged files refused.
run cuda_checkpoint env FLATSHARD_BIN_DIR="$bin" "$bin/checkpoint_test" --gtest_filter='Gpu/*'

sizes="1,16,64,256"
steps=40
((quick)) && sizes="16" && steps=15
echo "== device_collectives_bench (W=$gpus over NCCL)"
timeout --kill-after=10 "$step_timeout" "$bin/device_collectives_bench" --device cuda --comm nccl --worlds "$gpus" --sizes-mib "$sizes" \
  --iters 20 | tee "$log/collectives.md" || failed=1
echo "== train_step_bench (GPT, W=$gpus over NCCL)"
timeout --kill-after=10 "$step_timeout" "$bin/train_step_bench" --device cuda --model gpt --worlds "$gpus" --steps "$steps" --batch 32 \
  | tee "$log/step_gpt.md" || failed=1
echo "== train_step_bench (MLP, W=$gpus over NCCL)"
timeout --kill-after=10 "$step_timeout" "$bin/train_step_bench" --device cuda --worlds "$gpus" --steps "$steps" \
  | tee "$log/step_mlp.md" || failed=1

echo "== train_step_bench (35M MLP, W=$gpus over NCCL)"
timeout --kill-after=10 "$step_timeout" "$bin/train_step_bench" --device cuda --model mlp35m --worlds "$gpus" \
  --steps "$steps" --batch 256 | tee "$log/step_mlp35m.md" || failed=1

{
  echo
  echo "## GPU check: $gpu_name x$gpus ($(date -u +%Y-%m-%d))"
  echo
  echo "Measured by \`scripts/gpu-check.sh$( ((quick)) && echo " --quick")\` on ${gpu_lines[*]};"
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown). Tests:" \
       "$( ((failed)) && echo "SOME FAILED (see the log)" || echo "all passed")."
  echo
  echo "Unit all-gather / reduce through the runtime against the bare NCCL call on the same"
  echo "bytes (device events, medians):"
  echo
  cat "$log/collectives.md"
  echo
  echo "Training step (device events; exposed comm / step is the share of the step the"
  echo "compute stream waited for communication):"
  echo
  echo "GPT (examples/gpt-7m.yaml):"
  echo
  cat "$log/step_gpt.md"
  echo
  echo "MLP (examples/mlp.yaml):"
  echo
  cat "$log/step_mlp.md"
  echo
  echo "MLP 35M (bench/models/mlp35m.yaml, 256 samples a step):"
  echo
  cat "$log/step_mlp35m.md"
} >>"$results"
echo "gpu-check.sh: results appended to $results; logs in $log"
exit $failed
