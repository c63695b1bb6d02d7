#!/usr/bin/env bash
# Runs the real binaries' security flags: `flatshard certs init` and `token
# create`; daemons refuse bad TLS files at start (exit 2, naming the flag and
# the file) and a reachable address without TLS (unless --insecure, which
# starts and warns); a server with another role's certificate is refused. Usage: security_cli_test.sh <bin dir>
set -u
bin=$1
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
failures=0

expect() {  # expect <name> <want-exit> <pattern> -- command...
  local name=$1 want=$2 pattern=$3
  shift 4
  timeout 30 "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [[ $rc -ne $want ]]; then
    echo "FAIL $name: exit $rc, want $want"; cat "$tmp/out" "$tmp/err" | head -20
    failures=$((failures + 1)); return
  fi
  if ! grep -q -- "$pattern" "$tmp/out" "$tmp/err"; then
    echo "FAIL $name: output lacks '$pattern'"; cat "$tmp/out" "$tmp/err" | head -20
    failures=$((failures + 1)); return
  fi
  echo "ok   $name"
}

c=$tmp/certs
expect certs_init 0 "wrote $c/ca.pem" -- "$bin/flatshard" certs init "$c" --hosts node-a,10.9.8.7
expect certs_init_again 2 "already holds a cluster CA" -- "$bin/flatshard" certs init "$c"
[[ $(stat -c %a "$c/coordinator-key.pem") == 600 ]] || { echo "FAIL key mode"; failures=$((failures + 1)); }
openssl x509 -in "$c/worker.pem" -noout -text | grep -q "IP Address:10.9.8.7" \
  || { echo "FAIL worker SAN lacks 10.9.8.7"; failures=$((failures + 1)); }
openssl verify -CAfile "$c/ca.pem" "$c/admin.pem" >/dev/null \
  || { echo "FAIL admin.pem does not verify"; failures=$((failures + 1)); }

expect certs_renew_nothing 0 "nothing to renew in $c" -- "$bin/flatshard" certs renew "$c"
ca_before=$(sha256sum <"$c/ca.pem")
expect certs_renew_hosts 0 "renewed $c/worker.pem and its key: it names .*, not .*node-z" -- \
  "$bin/flatshard" certs renew "$c" --hosts node-z
openssl x509 -in "$c/worker.pem" -noout -ext subjectAltName | grep -q "DNS:node-z" \
  && [[ $(sha256sum <"$c/ca.pem") == "$ca_before" ]] \
  && openssl verify -CAfile "$c/ca.pem" "$c/coordinator.pem" >/dev/null \
  || { echo "FAIL renewed certificates: other CA, no node-z or not verified"; failures=$((failures + 1)); }
expect certs_renew_no_ca 2 "ca.pem does not exist" -- "$bin/flatshard" certs renew "$tmp/none"
expect token_create 0 "appended alice (operator)" -- \
  "$bin/flatshard" token create --name alice --role operator --tokens-file "$tmp/tokens"
token=$(head -1 "$tmp/out")
[[ ${#token} == 64 ]] && ! grep -q "$token" "$tmp/tokens" \
  || { echo "FAIL the tokens file holds the token or it is not 64 digits"; failures=$((failures + 1)); }
expect token_bad_role 2 "role 'root' is not one of" -- \
  "$bin/flatshard" token create --name x --role root

coord=("$bin/flatshard-coordinator" --state-dir "" --metrics-listen "")
tls=(--tls-cert "$c/coordinator.pem" --tls-key "$c/coordinator-key.pem" --tls-ca "$c/ca.pem")
expect coordinator_no_workers 2 "max-workers must be at least 1, got 0" -- \
  "${coord[@]}" --listen 127.0.0.1:0 --max-workers 0
expect coordinator_negative_stall 2 "stalled-write-timeout must be a number of seconds >= 0 (0: never), got -1" -- \
  "${coord[@]}" --listen 127.0.0.1:0 --stalled-write-timeout -1
expect coordinator_negative_keepalive 2 "keepalive-interval must be a number of seconds >= 0 (0: no pings), got -2" -- \
  "${coord[@]}" --listen 127.0.0.1:0 --keepalive-interval -2
expect coordinator_negative_stall_timeout 2 "stall-timeout must be a number of seconds >= 0 (0: never), got -1" -- \
  "${coord[@]}" --listen 127.0.0.1:0 --stall-timeout -1
expect coordinator_zero_batch_timeout 2 "batch-timeout must be a number of seconds > 0, got 0" -- \
  "${coord[@]}" --listen 127.0.0.1:0 --batch-timeout 0
expect coordinator_missing_cert 2 "tls-cert file '$tmp/none.pem' cannot be read" -- \
  "${coord[@]}" --listen 127.0.0.1:0 --tls-cert "$tmp/none.pem" --tls-key "$c/coordinator-key.pem"
expect coordinator_wrong_key 2 "is not the key of --tls-cert file '$c/coordinator.pem'" -- \
  "${coord[@]}" --listen 127.0.0.1:0 --tls-cert "$c/coordinator.pem" --tls-key "$c/admin-key.pem"
"$bin/flatshard" certs init "$tmp/other" >/dev/null
expect coordinator_foreign_ca 2 "is not signed by the CA in --tls-ca file '$tmp/other/ca.pem'" -- \
  "${coord[@]}" --listen 127.0.0.1:0 --tls-cert "$c/coordinator.pem" \
  --tls-key "$c/coordinator-key.pem" --tls-ca "$tmp/other/ca.pem"
expect coordinator_bad_tokens 2 "line 1: role 'boss'" -- bash -c \
  "echo '$(printf '%064d' 0) bob boss' > '$tmp/badtokens'; ${coord[*]} --listen 127.0.0.1:0 --tokens-file '$tmp/badtokens'"
expect coordinator_exposed 2 "0.0.0.0:0 is reachable from other hosts" -- \
  "${coord[@]}" --listen 0.0.0.0:0
expect worker_exposed 2 "--listen 0.0.0.0:0 is reachable from other hosts" -- \
  "$bin/flatshard-worker" --coordinator 127.0.0.1:1 --state-dir "" --listen 0.0.0.0:0
expect worker_key_missing 2 "tls-key file" -- \
  "$bin/flatshard-worker" --coordinator 127.0.0.1:1 --state-dir "" --tls-cert "$c/worker.pem" \
  --tls-key "$tmp/none-key.pem"

# Secured on a reachable address: starts. --insecure: starts and warns.
for mode in secured insecure; do
  if [[ $mode == secured ]]; then extra=("${tls[@]}"); else extra=(--insecure); fi
  mkfifo "$tmp/$mode.out"
  "${coord[@]}" --listen 0.0.0.0:0 "${extra[@]}" >"$tmp/$mode.out" 2>"$tmp/$mode.err" &
  pids+=($!)
  # Its first line, read as it comes (bounded): "... listening on HOST:PORT".
  line=""
  read -r -t 20 line <"$tmp/$mode.out"
  if [[ $line == *"listening on"* ]]; then echo "ok   coordinator_$mode starts"; else
    echo "FAIL coordinator_$mode did not start"; cat "$tmp/$mode.err"; failures=$((failures + 1)); fi
done
grep -q "without .* (--insecure)" "$tmp/insecure.err" \
  && echo "ok   insecure warns" || { echo "FAIL --insecure did not warn"; failures=$((failures + 1)); }

# A worker's certificate cannot serve as the coordinator's (the same CA signs
# both): the CLI and a worker daemon refuse it at the handshake
# (tests/unit/rpc/server_identity_test.cc shows no call gets through).
mkfifo "$tmp/impostor.out"
"${coord[@]}" --listen 127.0.0.1:0 --tls-cert "$c/worker.pem" --tls-key "$c/worker-key.pem" \
  --tls-ca "$c/ca.pem" >"$tmp/impostor.out" 2>"$tmp/impostor.err" &
pids+=($!)
line=""
read -r -t 20 line <"$tmp/impostor.out"
impostor=${line##* }
expect cli_refuses_a_worker_as_coordinator 1 "is not the coordinator (.*certificate of 'flatshard-worker', not of 'flatshard-coordinator'" -- \
  env FLATSHARD_TLS_CA="$c/ca.pem" FLATSHARD_TLS_CERT="$c/admin.pem" \
  FLATSHARD_TLS_KEY="$c/admin-key.pem" "$bin/flatshard" workers -c "$impostor"
expect worker_refuses_a_worker_as_coordinator 1 "certificate of 'flatshard-worker', not of 'flatshard-coordinator'" -- \
  "$bin/flatshard-worker" --coordinator "$impostor" --state-dir "" --metrics-listen "" \
  --tls-cert "$c/worker.pem" --tls-key "$c/worker-key.pem" --tls-ca "$c/ca.pem" --connect-timeout 3

# The coordinator's own certificate, dialed at a host it does not name
# (127.0.0.2, loopback too): the host check, told apart from the role's.
mkfifo "$tmp/elsewhere.out"
"${coord[@]}" --listen 127.0.0.2:0 "${tls[@]}" >"$tmp/elsewhere.out" 2>"$tmp/elsewhere.err" &
pids+=($!)
line=""
read -r -t 20 line <"$tmp/elsewhere.out"
elsewhere=${line##* }
expect cli_names_a_host_the_certificate_lacks 1 "certificate does not name the host of $elsewhere" -- \
  env FLATSHARD_TLS_CA="$c/ca.pem" FLATSHARD_TLS_CERT="$c/admin.pem" \
  FLATSHARD_TLS_KEY="$c/admin-key.pem" "$bin/flatshard" workers -c "$elsewhere"
grep -q "is not the coordinator" "$tmp/err" \
  && { echo "FAIL a host mismatch was called a role mismatch"; failures=$((failures + 1)); }

((failures == 0)) && echo "all passed" || echo "$failures failed"
exit $((failures > 0))
