# shellcheck shell=bash
# Sourced by scripts/demo.sh and the shell tests that need a local cluster.
#
#   start_flatshard_up FLATSHARD DIR [ARGS...]
# runs `FLATSHARD up --listen 127.0.0.1:0 --address-file DIR/coordinator
# ARGS...` in the background (log: DIR/up.log), stops it when the shell exits,
# and waits for the address file, which `up` writes once the job is READY:
# bounded (120 s), and failing at once with the log if `up` exits first. Sets
# $up (its pid) and $addr (the coordinator's address).
#   stop_flatshard_up
# stops it now (SIGTERM, then waits) and clears the exit trap.
start_flatshard_up() {
  local flatshard=$1 dir=$2
  shift 2
  "$flatshard" up --listen 127.0.0.1:0 --address-file "$dir/coordinator" "$@" \
    >"$dir/up.log" 2>&1 &
  up=$!
  trap 'kill -TERM $up 2>/dev/null || true; wait $up 2>/dev/null || true' EXIT
  for _ in $(seq 1200); do
    [[ -s "$dir/coordinator" ]] && break
    kill -0 "$up" 2>/dev/null || { cat "$dir/up.log"; return 1; }
    sleep 0.1
  done
  if [[ ! -s "$dir/coordinator" ]]; then
    echo "flatshard up wrote no address in 120 s" >&2
    cat "$dir/up.log" >&2
    return 1
  fi
  # shellcheck disable=SC2034  # for the caller
  addr=$(cat "$dir/coordinator")
}

stop_flatshard_up() {
  kill -TERM "$up" && wait "$up"
  trap - EXIT
}
