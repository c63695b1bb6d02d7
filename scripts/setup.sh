#!/usr/bin/env bash
# Installs every Debian package the build and the tests need. Idempotent: packages
# already present are skipped, and `apt-get update` runs only when something is missing.
set -euo pipefail
case "${1:-}" in
  "") ;;
  -h|--help) sed -n '2,3p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "setup.sh: unknown argument '$1' (it takes none; try --help)" >&2; exit 2 ;;
esac

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  protobuf-compiler libprotobuf-dev libgrpc++-dev protobuf-compiler-grpc
  libabsl-dev libgtest-dev libgmock-dev
  prometheus-cpp-dev prometheus libcurl4-openssl-dev
  libgloo-dev libopenblas-dev libsqlite3-dev libssl-dev
  nlohmann-json3-dev libyaml-cpp-dev libcli11-dev libspdlog-dev libxxhash-dev
  clang-format clang-tidy
  python3 python3-numpy python3-pip python3-venv
  iproute2
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
