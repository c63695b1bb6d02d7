#!/usr/bin/env bash
# Checks formatting (clang-format) and static analysis (clang-tidy with the
# repository's .clang-tidy) over flatshard's own C++ sources. Needs a configured
# and built build/ (compile_commands.json, and ninja's dependency log to find
# the translation units a changed header reaches).
#   scripts/lint.sh [--fix]      --fix rewrites files with clang-format instead
#   scripts/lint.sh --all        clang-tidy over every translation unit
#   scripts/lint.sh --baseline   --all, then records HEAD as the new baseline
#
# clang-tidy costs 6-15 s per translation unit here (it parses gRPC, Abseil and
# protobuf headers each time), so by default it checks only what changed since
# the commit in .ci/lint-baseline, where every unit was last found clean: the
# changed .cc files, and for each changed header one unit that reads it (its
# own .cc when it has one). That unit reports the header's own findings
# (those .clang-tidy's HeaderFilterRegex admits); the other units that include it are not tidied again,
# for one widely read header (job_state_machine.h, training_job.h) would
# bring 80 units, 15 minutes of CI. What a header change does to the code
# of those units is the compiler's to find (-Werror), and --all's.
# clang-format always checks every file (it is fast).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${FLATSHARD_BUILD_DIR:-build}"
mode="${1:-}"

mapfile -t sources < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
if [[ "$mode" == "--fix" ]]; then
  clang-format -i "${sources[@]}"
  echo "lint.sh: formatted ${#sources[@]} files"
  exit 0
fi

status=0
# The layering (docs/architecture.md §2): core is pure logic, so it includes
# nothing above it and touches no files, threads, sockets or devices; storage
# adds the disk and nothing above it. A compiler would not notice either.
layering="$(git grep -n -E '#include ["<](storage|worker|coordinator|client|rpc|metrics)/|#include <(fstream|filesystem|thread|mutex|shared_mutex|condition_variable|future|atomic|grpcpp/[^>]*|fcntl\.h|unistd\.h|sys/[^>]*)>' -- 'core/*.cc' 'core/*.h' || true)"
layering+="$(git grep -n -E '#include ["<](worker|coordinator|client|rpc|metrics)/|#include <(thread|mutex|future|grpcpp/[^>]*)>' -- 'storage/*.cc' 'storage/*.h' || true)"
if [[ -n "$layering" ]]; then
  echo "$layering" >&2
  echo "lint.sh: core/ or storage/ includes what its layer may not (docs/architecture.md §2)" >&2
  status=1
fi
if ! clang-format --dry-run -Werror "${sources[@]}"; then
  echo "lint.sh: clang-format found unformatted files (scripts/lint.sh --fix)" >&2
  status=1
fi

if [[ ! -f "$build_dir/compile_commands.json" ]]; then
  echo "lint.sh: $build_dir/compile_commands.json is missing; run scripts/build.sh" >&2
  exit 1
fi

# Translation units the build compiles with the host compiler.
mapfile -t all_units < <(git ls-files '*.cc')
baseline="$(cat .ci/lint-baseline 2>/dev/null || true)"
units=()
if [[ "$mode" == "--all" || "$mode" == "--baseline" || -z "$baseline" ]] ||
    ! git cat-file -e "${baseline}^{commit}" 2>/dev/null; then
  units=("${all_units[@]}")
  scope="all ${#units[@]} translation units"
else
  # Files changed since the baseline, committed or not.
  mapfile -t changed < <({ git diff --name-only "$baseline" -- '*.cc' '*.h' '*.cu' '*.cuh';
                           git ls-files --others --exclude-standard '*.cc' '*.h'; } | sort -u)
  declare -A wanted=()
  for f in "${changed[@]}"; do
    [[ "$f" == *.cc && -f "$f" ]] && wanted["$f"]=1
  done
  if ((${#changed[@]} > 0)); then
    # ninja's deps log: "object: #deps ..." then one indented path per input,
    # the source first: "header unit" for each unit that reads a changed
    # header, sorted so that the first unit of a header is stable.
    changed_abs=$(printf "$PWD/%s\n" "${changed[@]}")
    declare -A reader=() tracked=()
    for u in "${all_units[@]}"; do tracked["$u"]=1; done
    while read -r header unit; do
      [[ -z "$unit" || -z "${tracked[$unit]:-}" ]] && continue  # not generated code
      if [[ "$unit" == "${header%.h}.cc" ]]; then
        reader["$header"]="$unit"  # its own .cc first
      elif [[ -z "${reader[$header]:-}" ]]; then
        reader["$header"]="$unit"
      fi
    done < <(ninja -C "$build_dir" -t deps 2>/dev/null | awk -v root="$PWD/" -v list="$changed_abs" '
      BEGIN { n = split(list, files, "\n"); for (i = 1; i <= n; i++) hit[files[i]] = 1 }
      /^[^ ]/ { source = ""; first = 1; next }
      /^    / {
        path = $1
        if (first) { source = path; first = 0; next }
        if (hit[path] && index(source, root) == 1 && source ~ /\.cc$/)
          print substr(path, length(root) + 1), substr(source, length(root) + 1)
      }' | sort -u)
    for unit in "${reader[@]}"; do wanted["$unit"]=1; done
    for f in "${changed[@]}"; do
      if [[ "$f" == *.h && -f "$f" && -z "${reader[$f]:-}" ]]; then
        echo "lint.sh: no unit reads $f (not built yet?); clang-tidy does not check it" >&2
      fi
    done
  fi
  for u in "${all_units[@]}"; do
    [[ -n "${wanted[$u]:-}" ]] && units+=("$u")
  done
  scope="${#units[@]} of ${#all_units[@]} translation units (changed since $(git rev-parse --short "$baseline"))"
fi

if ((${#units[@]} > 0)); then
  if ! printf '%s\n' "${units[@]}" |
      xargs -P "$(nproc)" -n 1 clang-tidy -p "$build_dir" --quiet 2>/dev/null >"$build_dir/clang-tidy.log"; then
    grep -E "(warning|error):" "$build_dir/clang-tidy.log" | sort -u | head -50 >&2
    echo "lint.sh: clang-tidy reported problems (full log: $build_dir/clang-tidy.log)" >&2
    status=1
  fi
fi
if [[ $status -eq 0 ]]; then
  echo "lint.sh: clang-format clean (${#sources[@]} files), clang-tidy clean ($scope)"
  if [[ "$mode" == "--baseline" ]]; then
    git rev-parse HEAD >.ci/lint-baseline
    echo "lint.sh: .ci/lint-baseline is now $(git rev-parse --short HEAD); commit it"
  fi
fi
exit $status
