#!/usr/bin/env bash
# Prints the path of a Python venv holding REQUIREMENTS (a pip requirements file)
# and the flatshard package from client/python, creating the venv when needed.
#   scripts/python-env.sh client/python/requirements-test.txt
# Venvs live in ${FLATSHARD_CACHE:-~/.cache/flatshard}/venv-<hash of the
# requirements> so repeated runs (and the torch one, ~3 GB) are reused; a lock
# keeps concurrent tests from building the same venv twice. The package itself
# is reinstalled when client/python or proto/ changed. Progress goes to stderr.
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "" | -*) echo "usage: python-env.sh REQUIREMENTS_FILE (try --help)" >&2; exit 2 ;;
esac
[[ -f $1 ]] || { echo "python-env.sh: no requirements file '$1'" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
requirements=$(realpath "$1")
cache=${FLATSHARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/flatshard}
mkdir -p "$cache"

# The key covers every requirements file the given one includes (-r).
dir=$(dirname "$requirements")
mapfile -t included < <(sed -n "s|^-r[[:space:]]*|$dir/|p" "$requirements")
key=$(cat "$requirements" "${included[@]}" | sha256sum | cut -c1-16)
venv="$cache/venv-$key"

exec 9>"$cache/venv-$key.lock"
flock 9
if [[ ! -f "$venv/.complete" ]]; then
  echo "python-env: creating $venv from $requirements (once; cached)" >&2
  rm -rf "$venv"
  python3 -m venv "$venv" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements" >&2
  touch "$venv/.complete"
fi

# Reinstall the package only when its sources or the protos changed.
package_key=$(cd "$root" && find client/python proto -type f \
  \( -name '*.py' -o -name '*.proto' -o -name '*.toml' -o -name '*.typed' \) -print0 \
  | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
if [[ "$(cat "$venv/.flatshard-package" 2>/dev/null)" != "$package_key" ]]; then
  echo "python-env: installing client/python into $venv" >&2
  build=$(mktemp -d)
  cp -r "$root/client/python" "$build/src"
  # setup.py finds proto/ two levels up from the package, as in the repository.
  mkdir -p "$build/proto" && cp -r "$root/proto/flatshard" "$build/proto/"
  mkdir -p "$build/client" && mv "$build/src" "$build/client/python"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-build-isolation \
    --no-deps --force-reinstall "$build/client/python" >&2
  rm -rf "$build"
  echo "$package_key" >"$venv/.flatshard-package"
fi
echo "$venv"
