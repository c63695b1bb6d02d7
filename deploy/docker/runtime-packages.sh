#!/usr/bin/env bash
# Prints, one per line, the packages that own the shared libraries PROGRAMs
# load, so that a runtime image installs exactly those and no build tools.
# Asked of dpkg rather than written down because the names differ between
# releases (Debian 12's libgrpc++1.51 is Ubuntu 24.04's libgrpc++1.51t64).
#   runtime-packages.sh [--exclude ERE] PROGRAM...
# --exclude leaves out packages the runtime base image already has (the CUDA
# runtime image's cuda-cudart-*, libnccl2); their libraries may also live
# outside any package (a toolkit under /usr/local/cuda), which is then allowed.
# Any other library that no package owns is an error: the image would lack it.
# Libraries opened with dlopen (OpenBLAS, cuBLAS) are not seen: the
# Dockerfiles name those.
set -euo pipefail
exclude=""
if [[ ${1:-} == --exclude ]]; then exclude=$2; shift 2; fi
(($#)) || { echo "usage: runtime-packages.sh [--exclude ERE] PROGRAM..." >&2; exit 2; }

mapfile -t libs < <(for program in "$@"; do ldd "$program"; done |
  awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u)
unowned=()
packages=()
for lib in "${libs[@]}"; do
  real=$(readlink -f "$lib")
  # dpkg records a library under /lib or /usr/lib depending on the package's
  # age, while the merged /usr makes readlink answer /usr/lib: ask for both.
  owner=$(dpkg -S "$real" 2>/dev/null || dpkg -S "${real#/usr}" 2>/dev/null || true)
  if [[ -z $owner ]]; then
    [[ -n $exclude && $real =~ /usr/local/cuda ]] || unowned+=("$real")
    continue
  fi
  packages+=("${owner%%:*}")
done
if ((${#unowned[@]})); then
  echo "runtime-packages.sh: no package owns ${unowned[*]}" >&2
  exit 1
fi
printf '%s\n' "${packages[@]}" | sort -u | { if [[ -n $exclude ]]; then grep -Ev "$exclude"; else cat; fi; }
