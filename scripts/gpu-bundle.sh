#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh --prebuilt runs, for a GPU machine that has the
# CUDA driver and toolkit but not flatshard's build dependencies (gRPC,
# protobuf, Abseil, Gloo, OpenBLAS, ...): the GPU check's binaries, stripped,
# and every shared library they need that is not part of the C library or the
# CUDA toolkit (the GPU machine's own cudart, cuBLAS and NCCL are used there).
#
#   scripts/gpu-bundle.sh [--build-dir DIR] OUT.tar.xz
#   # on the GPU machine, from a checkout of the same commit:
#   mkdir -p /tmp/fs && tar -C /tmp/fs -xJf OUT.tar.xz && scripts/gpu-check.sh --prebuilt /tmp/fs
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="build"
while (($#)); do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) out="$1"; shift ;;
  esac
done
[[ -n "${out:-}" ]] || { echo "gpu-bundle.sh: name the bundle to write (try --help)" >&2; exit 2; }
binaries=(cuda_stream_test nccl_collectives_test fsdp_equivalence_test checkpoint_test device_collectives_bench
          train_step_bench flatshard-train-local flatshard-worker flatshard-coordinator flatshard)
stage="$(mktemp -d)"
mkdir -p "$stage/bin" "$stage/lib"
for b in "${binaries[@]}"; do
  [[ -x "$build_dir/bin/$b" ]] || { echo "gpu-bundle.sh: $build_dir/bin/$b is not built" >&2; exit 1; }
  strip -o "$stage/bin/$b" "$build_dir/bin/$b"
done
# Libraries the dynamic linker resolves here, minus the CUDA toolkit's and glibc's
# (libmvec and libresolv among them: they bind to the C library's private symbols,
# so a copy from another glibc fails to load).
ldd "${binaries[@]/#/$build_dir/bin/}" 2>/dev/null | awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libmvec|libresolv|libnsl|libutil|libanl|libnss_[a-z]*|libdl|libpthread|librt|ld-linux[^/]*|libgcc_s)\.so|libcuda|libcudart|libcublas|libnccl' |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
# Opened at run time, so ldd does not list it.
cp -L "$(ldconfig -p | awk '/libopenblas\.so\.0 / {print $NF; exit}')" "$stage/lib/"
strip --strip-unneeded "$stage"/lib/* 2>/dev/null || true
tar -C "$stage" -cJf "$out" .
rm -rf "$stage"
echo "gpu-bundle.sh: wrote $out ($(du -h "$out" | cut -f1))"
