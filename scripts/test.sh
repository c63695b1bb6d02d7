#!/usr/bin/env bash
# The test command (README.md, .ci/run): installs dependencies, configures, builds
# and runs every test; exits non-zero on any failure.
#   scripts/test.sh                     build/ + all tests + lint
#   scripts/test.sh --sanitizer asan    ASan+UBSan build in build-asan/, all tests
#   scripts/test.sh --sanitizer tsan    TSan build in build-tsan/, all tests
#   scripts/test.sh --no-lint           skip clang-format/clang-tidy
set -euo pipefail
cd "$(dirname "$0")/.."

sanitizer=""
lint=1
while (($#)); do
  case "$1" in
    --sanitizer) sanitizer="${2,,}"; shift 2 ;;
    --no-lint) lint=0; shift ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "test.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done

# A full run (torch venv, build, test scratch) needs a few GiB; say so up front
# rather than fail later inside the compiler with "No space left on device".
need_gib=6
for dir in . "${TMPDIR:-/tmp}"; do
  free_gib=$(( $(df -Pk "$dir" | awk 'NR==2 {print $4}') / 1048576 ))
  if ((free_gib < need_gib)); then
    echo "test.sh: warning: only ${free_gib} GiB free on the file system of $dir;" \
         "a full build and test run needs about ${need_gib} GiB" >&2
  fi
done

bash scripts/setup.sh
build_args=()
build_dir=build
if [[ -n "$sanitizer" ]]; then
  build_args=(--sanitizer "$sanitizer")
  build_dir="build-$sanitizer"
  lint=0
fi
bash scripts/build.sh "${build_args[@]}"

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp}"
# One BLAS thread per process everywhere: workers run one per core, and
# OpenBLAS's own pool is invisible to ThreadSanitizer.
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
(cd "$build_dir" && ctest --output-on-failure -j "$(nproc)" --timeout 600)

if ((lint)); then
  FLATSHARD_BUILD_DIR="$build_dir" bash scripts/lint.sh
fi
echo "test.sh: all tests passed${sanitizer:+ under $sanitizer}"
