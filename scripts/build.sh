#!/usr/bin/env bash
# Configures and builds flatshard with CMake + Ninja.
#   scripts/build.sh [--sanitizer asan|tsan] [--build-dir DIR] [--cuda AUTO|ON|OFF] [TARGET...]
# Default build dir: build/ (build-asan/, build-tsan/ for sanitizer builds); no
# TARGET builds everything (the tests too).
set -euo pipefail
cd "$(dirname "$0")/.."

sanitizer=""
build_dir=""
cuda="AUTO"
targets=()
jobs="${FLATSHARD_JOBS:-$(nproc)}"
while (($#)); do
  case "$1" in
    --sanitizer) sanitizer="${2^^}"; shift 2 ;;
    --build-dir) build_dir="$2"; shift 2 ;;
    --cuda) cuda="${2^^}"; shift 2 ;;
    -h|--help) sed -n '2,5p' "$0"; exit 0 ;;
    -*) echo "build.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
case "$sanitizer" in
  "") build_dir="${build_dir:-build}" ;;
  ASAN|TSAN) build_dir="${build_dir:-build-${sanitizer,,}}" ;;
  *) echo "build.sh: --sanitizer must be asan or tsan, got '$sanitizer'" >&2; exit 2 ;;
esac

cmake -S . -B "$build_dir" -G Ninja \
  -DFLATSHARD_SANITIZER="$sanitizer" -DFLATSHARD_CUDA="$cuda" >/dev/null
ninja -C "$build_dir" -j "$jobs" "${targets[@]}"
echo "build.sh: built in $build_dir/"
