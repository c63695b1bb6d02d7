#!/usr/bin/env bash
# Checks deploy/ and docs/deploy.md without a cluster (docs/deploy.md, "What
# is tested"): the Kubernetes manifests rendered by kustomize and validated
# offline, the Compose file, the systemd units, the shell scripts, every
# flatshard command written down against the programs' --help, and, in
# namespaces of its own, the Compose services' and Kubernetes containers'
# commands run for real. A missing tool skips only its part, saying why.
#   deploy_test.sh SOURCE_DIR WORK_DIR
# The programs are WORK_DIR/../bin (ctest's build tree), else
# SOURCE_DIR/build/bin, or $FLATSHARD_BIN_DIR. Python packages go into a
# virtualenv under WORK_DIR, kept between runs (keyed by the requirements).
# Exit: 0 passed (some parts may be skipped), 1 a check failed, 77 nothing
# could be checked.
set -uo pipefail
(($# == 2)) || { echo "usage: deploy_test.sh SOURCE_DIR WORK_DIR" >&2; exit 2; }
src=$(cd "$1" && pwd)
mkdir -p "$2"
work=$(cd "$2" && pwd)
here="$src/tests/deploy"
run=$(mktemp -d "$work/run.XXXXXX")
trap 'rm -rf "$run"' EXIT

passed=0 failed=0 skipped=0
pass() { echo "PASS: $1"; passed=$((passed + 1)); }
fail() { echo "FAIL: $1"; failed=$((failed + 1)); }
skip() { echo "SKIP: $1"; skipped=$((skipped + 1)); }
indent() {
  local line
  while IFS= read -r line; do printf '    %s\n' "$line"; done <<<"$1"
}
# check NAME COMMAND...: passes when COMMAND does, else shows its output.
check() {
  local name=$1 out
  shift
  if out=$("$@" 2>&1); then pass "$name"; else fail "$name"; indent "$out"; fi
}
# tally FILE RC NAME: counts a Python checker's PASS:/FAIL:/SKIP: lines; a
# checker that failed without saying so (a crash) is a failure of its own.
tally() {
  local line
  while IFS= read -r line; do
    case $line in
      PASS:*) passed=$((passed + 1)) ;;
      FAIL:*) failed=$((failed + 1)) ;;
      SKIP:*) skipped=$((skipped + 1)) ;;
    esac
    echo "$line"
  done <"$1"
  if (($2 != 0)) && ! grep -q '^FAIL:' "$1"; then fail "$3 exited $2"; fi
}
have() { command -v "$1" >/dev/null 2>&1; }

bin=""
for dir in "${FLATSHARD_BIN_DIR:-}" "$work/../bin" "$src/build/bin"; do
  if [[ -n $dir && -x $dir/flatshard && -x $dir/flatshard-coordinator && -x $dir/flatshard-worker ]]; then
    bin=$(cd "$dir" && pwd)
    break
  fi
done
[[ -n $bin ]] && echo "programs: $bin" || echo "programs: not built (the checks that run them skip)"

# ------------------------------------------------------------------ shellcheck
if have shellcheck; then
  check "shellcheck: deploy/slurm/*.sbatch, deploy/**/*.sh, this test" \
    shellcheck "$src"/deploy/slurm/*.sbatch "$src"/deploy/docker/*.sh "$src"/deploy/k8s/base/*.sh \
    "$here/deploy_test.sh"
else
  skip "shellcheck: not installed (apt-get install shellcheck)"
fi

# ------------------------------------------------------------------- kustomize
if have kubectl; then
  for overlay in base overlays/cpu overlays/gpu; do
    name=${overlay##*/}
    if kubectl kustomize "$src/deploy/k8s/$overlay" >"$run/k8s-$name.yaml" 2>"$run/kustomize.err"; then
      pass "kubectl kustomize deploy/k8s/$overlay"
    else
      fail "kubectl kustomize deploy/k8s/$overlay"
      indent "$(cat "$run/kustomize.err")"
      rm -f "$run/k8s-$name.yaml"
    fi
  done
else
  skip "kubectl kustomize: kubectl is not installed (the manifest checks skip)"
fi

# ---------------------------------------------------------------------- Python
# kubernetes-validate ships the Kubernetes schemas, so validation is offline
# once it is installed; it brings PyYAML, which every checker here needs.
requirements="kubernetes-validate==1.37.0"
py=""
if have python3; then
  key=$(printf '%s\n%s\n' "$requirements" "$(python3 --version 2>&1)" | sha256sum | cut -c1-12)
  venv="$work/venv-$key"
  if [[ ! -x $venv/bin/python ]] || ! "$venv/bin/python" -c 'import kubernetes_validate, yaml' 2>/dev/null; then
    rm -rf "$work"/venv-*
    echo "installing $requirements into $venv"
    if python3 -m venv "$venv" >/dev/null 2>&1 &&
      timeout 600 "$venv/bin/python" -m pip install --quiet --disable-pip-version-check $requirements; then
      :
    else
      rm -rf "$venv"
    fi
  fi
  if [[ -x $venv/bin/python ]]; then
    py=$venv/bin/python
  elif python3 -c 'import yaml' 2>/dev/null; then
    py=python3
    skip "kubernetes-validate: could not be installed from PyPI (schema validation skips)"
  fi
fi

if [[ -n $py ]]; then
  (cd "$here" && "$py" -B static_checks.py "$src" "$run" "$bin") >"$run/static.out" 2>&1
  tally "$run/static.out" $? "static_checks.py"
else
  skip "manifests, Compose, Dockerfiles, commands: no Python with PyYAML (python3 is missing, or venv and pip failed)"
fi

# --------------------------------------------------------------------- systemd
if have systemd-analyze; then
  # verify needs every ExecStart= program to exist: the built ones, else a
  # stand-in, the rest of each unit unchanged.
  units="$run/systemd"
  mkdir -p "$units"
  for unit in "$src"/deploy/systemd/*.service; do
    if [[ -n $bin ]]; then
      sed "s#/usr/local/bin/#$bin/#g" "$unit" >"$units/${unit##*/}"
    else
      sed -E "s#/usr/local/bin/flatshard[a-z-]*#/bin/true#g" "$unit" >"$units/${unit##*/}"
    fi
  done
  # It reports problems (an unknown key, a bad value) on stderr and still
  # exits 0: any output is a failure.
  out=$(cd "$units" && systemd-analyze verify ./*.service 2>&1)
  if [[ $? -eq 0 && -z $out ]]; then pass "systemd-analyze verify deploy/systemd/*.service"; else
    fail "systemd-analyze verify deploy/systemd/*.service"
    indent "$out"
  fi
  for unit in "$units"/*.service; do
    level=$(systemd-analyze security --offline=true "$unit" 2>/dev/null |
      sed -n 's/.*Overall exposure level for .*: \([0-9.]*\).*/\1/p')
    if [[ -n $level ]] && awk -v l="$level" 'BEGIN { exit !(l <= 3.0) }'; then
      pass "systemd-analyze security ${unit##*/}: exposure $level (at most 3.0)"
    else
      fail "systemd-analyze security ${unit##*/}: exposure '${level:-none}', more than 3.0 or not rated"
    fi
  done
else
  skip "systemd: systemd-analyze is not installed"
fi
if have systemd-sysusers; then
  mkdir -p "$run/sysroot/etc"
  name="systemd-sysusers deploy/systemd/flatshard.sysusers.conf makes flatshard with uid 10001"
  if out=$(systemd-sysusers --root="$run/sysroot" "$src/deploy/systemd/flatshard.sysusers.conf" 2>&1) &&
    grep -q '^flatshard:x:10001:10001:' "$run/sysroot/etc/passwd"; then
    pass "$name"
  else
    fail "$name"
    indent "$out"
  fi
else
  skip "systemd-sysusers: not installed"
fi

# ---------------------------------------------------------------- Prometheus
if have promtool; then
  mkdir -p "$run/prometheus"
  cp "$src/deploy/docker/prometheus.yml" "$src/deploy/prometheus/flatshard-rules.yml" "$run/prometheus/"
  check "promtool check config deploy/docker/prometheus.yml (with flatshard-rules.yml)" \
    promtool check config "$run/prometheus/prometheus.yml"
else
  skip "promtool: not installed (apt-get install prometheus)"
fi

# ---------------------------------------------------------------------- Docker
if ! have docker; then
  skip "docker compose config, docker build: docker is not installed"
else
  if docker compose version >/dev/null 2>&1; then
    check "docker compose config deploy/docker/compose.yaml" \
      docker compose -f "$src/deploy/docker/compose.yaml" config -q
  else
    skip "docker compose config: the Compose plugin is missing ('docker compose version' fails)"
  fi
  if ! info=$(timeout 10 docker info 2>&1) || grep -q "Cannot connect" <<<"$info"; then
    skip "docker build: no Docker daemon reachable (docker info: $(grep -m1 'Cannot connect\|error' <<<"$info" || echo 'timed out'))"
  elif ! timeout 120 docker pull -q debian:bookworm-slim >/dev/null 2>&1; then
    skip "docker build: the daemon cannot pull debian:bookworm-slim (no registry reachable)"
  else
    check "docker build --check deploy/docker/Dockerfile.cpu (BuildKit's lint)" \
      docker build --check -f "$src/deploy/docker/Dockerfile.cpu" "$src"
    if [[ ${FLATSHARD_DEPLOY_TEST_DOCKER_BUILD:-0} == 1 ]]; then
      check "docker build deploy/docker/Dockerfile.cpu" \
        docker build -q -f "$src/deploy/docker/Dockerfile.cpu" -t flatshard-cpu:deploy-test "$src"
    else
      skip "docker build (the image): compiles flatshard, tens of minutes; FLATSHARD_DEPLOY_TEST_DOCKER_BUILD=1 runs it"
    fi
  fi
fi

# ------------------------------------------------------------------------ live
# PID 1 of a PID namespace: whatever it starts dies with it (--kill-child:
# also when the timeout ends unshare).
namespaces=(unshare --pid --fork --kill-child --mount --net --mount-proc)
if [[ -z $bin ]]; then
  skip "live Compose and Kubernetes commands: flatshard is not built"
elif [[ -z $py ]]; then
  skip "live Compose and Kubernetes commands: no Python with PyYAML"
elif [[ $(id -u) -ne 0 ]] || ! have unshare || ! have ip || ! "${namespaces[@]}" true 2>/dev/null; then
  skip "live Compose and Kubernetes commands: need root, unshare and ip for a network namespace of their own"
elif [[ ! -s $run/k8s-base.yaml ]]; then
  skip "live Compose and Kubernetes commands: no rendered manifests (kubectl)"
else
  (cd "$here" && timeout 180 "${namespaces[@]}" "$py" -B live_checks.py "$src" "$run" "$bin") \
    >"$run/live.out" 2>&1
  tally "$run/live.out" $? "live_checks.py"
fi

echo "$passed passed, $failed failed, $skipped skipped"
((failed == 0)) || exit 1
((passed > 0)) || exit 77
exit 0
