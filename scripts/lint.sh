#!/usr/bin/env bash
# Checks formatting (clang-format) and static analysis (clang-tidy with the
# repository's .clang-tidy) over flatshard's own C++ sources. Needs a configured
# build/ for compile_commands.json (scripts/build.sh makes one).
#   scripts/lint.sh [--fix]      --fix rewrites files with clang-format instead
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${FLATSHARD_BUILD_DIR:-build}"

mapfile -t sources < <(git ls-files '*.cc' '*.h' '*.cu')
if [[ "${1:-}" == "--fix" ]]; then
  clang-format -i "${sources[@]}"
  echo "lint.sh: formatted ${#sources[@]} files"
  exit 0
fi

status=0
if ! clang-format --dry-run -Werror "${sources[@]}"; then
  echo "lint.sh: clang-format found unformatted files (scripts/lint.sh --fix)" >&2
  status=1
fi

if [[ ! -f "$build_dir/compile_commands.json" ]]; then
  echo "lint.sh: $build_dir/compile_commands.json is missing; run scripts/build.sh" >&2
  exit 1
fi
# Only translation units the build compiles with the host compiler.
mapfile -t units < <(git ls-files '*.cc')
if ! printf '%s\n' "${units[@]}" |
    xargs -P "$(nproc)" -n 1 clang-tidy -p "$build_dir" --quiet 2>/dev/null >"$build_dir/clang-tidy.log"; then
  grep -E "(warning|error):" "$build_dir/clang-tidy.log" | sort -u | head -50 >&2
  echo "lint.sh: clang-tidy reported problems (full log: $build_dir/clang-tidy.log)" >&2
  status=1
fi
[[ $status -eq 0 ]] && echo "lint.sh: clang-format and clang-tidy clean (${#sources[@]} files)"
exit $status
