#!/usr/bin/env bash
# The long fault-injection suite (tests/fault/, docs/fault-tolerance.md): N
# rounds of random faults against a local cluster of real processes, then the
# summary table (what bench/RESULTS.md records). CI runs the 4-round version
# through ctest. Usage: scripts/fault-suite.sh [--rounds N] [--seed S] [--in-memory K]
# (K: checkpoints.in_memory_every_steps, default 1; 0 turns peer snapshots off)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=50
seed=1
in_memory=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --in-memory) in_memory=$2; shift 2 ;;
    -h|--help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "fault-suite.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$in_memory" =~ ^[0-9]+$ ]] ||
  { echo "fault-suite.sh: --in-memory must be a step count >= 0, got '$in_memory'" >&2; exit 2; }
[[ "$rounds" =~ ^[1-9][0-9]*$ && "$rounds" -le 1000 ]] ||
  { echo "fault-suite.sh: --rounds must be 1..1000, got '$rounds'" >&2; exit 2; }
bin=build/bin/fault_suite_test
[[ -x "$bin" ]] || { echo "fault-suite.sh: $bin is missing; run scripts/build.sh first" >&2; exit 2; }
report=$(mktemp -t flatshard-fault-report.XXXXXX)
echo "fault suite: $rounds rounds, seed $seed ($(nproc) cores, $(date -u +%Y-%m-%d))"
OPENBLAS_NUM_THREADS=1 FLATSHARD_FAULT_ROUNDS=$rounds FLATSHARD_FAULT_SEED=$seed \
  FLATSHARD_FAULT_IN_MEMORY=$in_memory \
  FLATSHARD_FAULT_REPORT=$report "$bin" 2>&1 | grep -E '^round [0-9]+:|FAILED|Failure' || true
echo
cat "$report"
# Passed: every fault recovered and no checkpoint corrupt or partial.
line=$(grep -E '^[0-9]+ of [0-9]+ faults recovered' "$report") ||
  { echo "fault-suite.sh: the suite ended without a summary" >&2; exit 1; }
read -r recovered _ injected _ <<<"$line"
[[ "$recovered" == "$injected" ]] && grep -q "corrupt or partial checkpoints: 0" "$report"
