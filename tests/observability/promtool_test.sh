#!/usr/bin/env bash
# promtool on deploy/prometheus: both scrape configurations and the rules
# check, and the rule unit tests (worker down, rank stuck) pass.
#   promtool_test.sh SOURCE_DIR
set -euo pipefail
dir=$1/deploy/prometheus
command -v promtool >/dev/null || { echo "promtool not found (apt-get install prometheus)"; exit 1; }

promtool check rules "$dir/flatshard-rules.yml"
promtool test rules "$dir/tests/flatshard-rules_test.yml"
promtool check config "$dir/prometheus-local.yml"

# Debian builds Prometheus without Kubernetes service discovery, so its
# promtool rejects kubernetes_sd_configs as an unknown field. There, check
# everything else in the file (relabelling, rule files, globals) with the
# discovery block swapped for an empty static one, and say so.
out=$(promtool check config "$dir/prometheus-k8s.yml" 2>&1) && { echo "$out"; exit 0; }
if grep -q "field kubernetes_sd_configs not found" <<<"$out"; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  cp "$dir/flatshard-rules.yml" "$tmp/"
  python3 - "$dir/prometheus-k8s.yml" "$tmp/prometheus-k8s.yml" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
swapped, n = re.subn(r"kubernetes_sd_configs:\n(\s+)- role: pod\n",
                     r"static_configs:\n\1- targets: []\n", text)
assert n == 1, "prometheus-k8s.yml: expected one kubernetes_sd_configs block with role: pod"
open(sys.argv[2], "w").write(swapped)
PY
  echo "note: this promtool has no Kubernetes discovery; checking prometheus-k8s.yml without it"
  promtool check config "$tmp/prometheus-k8s.yml"
else
  echo "$out"
  exit 1
fi
