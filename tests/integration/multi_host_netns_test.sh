#!/usr/bin/env bash
# A multi-host cluster on one machine (issue #13 §4): the coordinator, three
# workers and the CLI each run in a network namespace of their own, joined by
# veth pairs to a bridge in a "switch" namespace, with addresses of their own
# (10.201.0.0/24, no loopback between them). Everything is secured as on a real
# cluster (mutual TLS from `flatshard certs init`, a tokens file, a join
# token). The job (the demo MLP at world size 3) trains, saves a SHARDED
# checkpoint into the one directory every namespace shares (the shared
# checkpoint volume), verifies it, trains on, loads it back and summons the
# model. It asserts that the workers registered with their own addresses and
# that each one's collectives crossed the bridge (its veth's byte counters grew
# by at least what FSDP must send and receive per step, by `flatshard plan`),
# then SIGKILLs one worker and checks the job recovers as
# docs/fault-tolerance.md says: the failed rank named, shrunk to world size 2,
# restored from the checkpoint, and training again.
#
# Needs root and `ip netns` (iproute2); exits 77 (skipped) otherwise.
# Usage: multi_host_netns_test.sh <bin dir> <source dir> <work dir>
set -euo pipefail

if (($# != 3)); then
  echo "usage: $0 <bin dir> <source dir> <work dir>" >&2
  exit 2
fi
bin=$(realpath "$1")
src=$(realpath "$2")
work_root=$3

if [[ $(id -u) -ne 0 ]]; then
  echo "SKIP: needs root for network namespaces (running as uid $(id -u))"
  exit 77
fi
if ! command -v ip >/dev/null; then
  echo "SKIP: no 'ip' command (install iproute2)"
  exit 77
fi
for b in flatshard flatshard-coordinator flatshard-worker; do
  [[ -x $bin/$b ]] || { echo "FAIL: $bin/$b is missing (build first)" >&2; exit 1; }
done
command -v python3 >/dev/null || { echo "FAIL: python3 is needed to read --json output" >&2; exit 1; }

# Names unique to this run: two runs (or a run and another test's namespaces)
# never collide. Links are created inside the namespaces, never in the root
# one, so their names need only be unique per namespace. Each run's network is
# isolated from every other, so the addresses may repeat.
tag=fsmh$$
ns_switch=$tag-sw
ns_coord=$tag-co
ns_client=$tag-cl
ns_workers=("$tag-w1" "$tag-w2" "$tag-w3")
coord_ip=10.201.0.1
client_ip=10.201.0.2
worker_ips=(10.201.0.11 10.201.0.12 10.201.0.13)
port=7070  # fixed: nothing else listens in the coordinator's namespace
coord_addr=$coord_ip:$port
job=mh-demo
train_steps=5
ckpt=mh-sharded-5

mkdir -p "$work_root"
work=$(mktemp -d "$(realpath "$work_root")/run-$$-XXXXXX")
shared=$work/shared-checkpoints  # the checkpoint volume every "host" mounts
logs=$work/logs
mkdir -p "$shared" "$logs"

namespaces=()
pids=()
log_files=()
started=$(date +%s)

print_logs() {
  local f
  for f in "${log_files[@]}"; do
    [[ -f $f ]] || continue
    echo "----- tail of $f" >&2
    tail -n 30 "$f" >&2
  done
}

cleanup() {
  local rc=$?
  set +e
  trap - EXIT INT TERM
  if ((rc != 0 && rc != 77)); then print_logs; fi
  local pid p ns _
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for _ in $(seq 100); do  # at most 10 s for a clean shutdown
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    ((alive == 0)) && break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  # Anything else still running inside our namespaces is ours too.
  for ns in "${namespaces[@]}"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
  done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
  # Deleting a namespace destroys the veth ends and the bridge in it.
  for ns in "${namespaces[@]}"; do
    ip netns del "$ns" 2>/dev/null || echo "warning: could not delete namespace $ns" >&2
  done
  if ((rc == 0)); then
    rm -rf "$work"
  elif ((rc != 77)); then
    echo "work directory kept for inspection: $work" >&2
  else
    rm -rf "$work"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# --- The network ------------------------------------------------------------
# A run killed with SIGKILL (a CTest timeout) could not run its trap: remove
# the namespaces of runs whose script is gone (their daemons first).
for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^fsmh[0-9]+-(sw|co|cl|w[0-9])$/ { print $1 }'); do
  owner=${ns#fsmh}
  owner=${owner%%-*}
  if ! grep -qs multi_host_netns_test "/proc/$owner/cmdline"; then
    echo "removing namespace $ns left by an earlier run (pid $owner, gone)"
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  fi
done

if ! err=$(ip netns add "$ns_switch" 2>&1); then
  echo "SKIP: 'ip netns add' failed: $err"
  exit 77
fi
namespaces+=("$ns_switch")
ip -n "$ns_switch" link set lo up
ip -n "$ns_switch" link add br0 type bridge
ip -n "$ns_switch" link set br0 up

# add_host NS IP PORT_NAME: a namespace whose eth0 is cabled to the bridge.
add_host() {
  local ns=$1 addr=$2 sw_port=$3
  ip netns add "$ns"
  namespaces+=("$ns")
  ip -n "$ns_switch" link add "$sw_port" type veth peer name eth0 netns "$ns"
  ip -n "$ns_switch" link set "$sw_port" master br0 up
  ip -n "$ns" addr add "$addr/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
}
add_host "$ns_coord" "$coord_ip" p-coord
add_host "$ns_client" "$client_ip" p-client
for i in 0 1 2; do add_host "${ns_workers[$i]}" "${worker_ips[$i]}" "p-w$((i + 1))"; done

# --- Secrets, as docs/security.md "A real cluster" -----------------------------
sec=$work/secrets
"$bin/flatshard" certs init "$sec" \
  --hosts "$coord_ip,$(IFS=,; echo "${worker_ips[*]}")" >"$logs/certs.log"
"$bin/flatshard" token create --name mh-admin --role admin --tokens-file "$sec/tokens" \
  >"$sec/admin.token" 2>>"$logs/certs.log"
"$bin/flatshard" token create --name mh-nodes --role worker --tokens-file "$sec/tokens" \
  >"$sec/join.token" 2>>"$logs/certs.log"
chmod 600 "$sec/admin.token" "$sec/join.token"
client_auth=(--tls-cert "$sec/admin.pem" --tls-key "$sec/admin-key.pem" --tls-ca "$sec/ca.pem"
  --token-file "$sec/admin.token")

# --- Daemons ----------------------------------------------------------------
export OPENBLAS_NUM_THREADS=1
coord_log=$logs/coordinator.log
log_files+=("$coord_log")
ip netns exec "$ns_coord" "$bin/flatshard-coordinator" --listen "$coord_addr" \
  --heartbeat-interval 1 --heartbeat-timeout 4 \
  --checkpoint-root "$shared" --state-dir "$work/coordinator-state" \
  --address-file "$work/coordinator.address" \
  --tls-cert "$sec/coordinator.pem" --tls-key "$sec/coordinator-key.pem" --tls-ca "$sec/ca.pem" \
  --tokens-file "$sec/tokens" --audit-log "$work/audit.log" >"$coord_log" 2>&1 &
coord_pid=$!
pids+=("$coord_pid")

# wait_until SECONDS WHAT COMMAND...: polls COMMAND every 0.2 s, bounded.
wait_until() {
  local limit=$1 what=$2
  shift 2
  local deadline=$(($(date +%s) + limit))
  until "$@"; do
    (($(date +%s) < deadline)) || fail "$what: not within ${limit}s"
    sleep 0.2
  done
}
coordinator_listening() {
  kill -0 "$coord_pid" 2>/dev/null || fail "the coordinator exited"
  [[ -s $work/coordinator.address ]]
}
wait_until 30 "coordinator listening on $coord_addr" coordinator_listening
[[ $(cat "$work/coordinator.address") == "$coord_addr" ]] \
  || fail "coordinator listens on $(cat "$work/coordinator.address"), not $coord_addr"

worker_pids=()
for i in 0 1 2; do
  w=w$((i + 1))
  mkdir -p "$work/$w/state" "$work/$w/data"
  log=$logs/$w.log
  log_files+=("$log")
  # A PID namespace of its own too, as on separate hosts: the workers' probe
  # for same-host copies (process_vm_readv) must fail and fall back to TCP
  # (asserted below), so their collectives cross the bridge. --kill-child: a
  # SIGKILL of the launcher reaches the worker.
  ip netns exec "${ns_workers[$i]}" unshare --pid --fork --kill-child "$bin/flatshard-worker" \
    --coordinator "$coord_addr" --worker-id "mh-$w" \
    --listen "${worker_ips[$i]}:0" --advertise-host "${worker_ips[$i]}" \
    --state-dir "$work/$w/state" --data-dir "$work/$w/data" --checkpoint-dir "$shared" \
    --tls-cert "$sec/worker.pem" --tls-key "$sec/worker-key.pem" --tls-ca "$sec/ca.pem" \
    --join-token-file "$sec/join.token" >"$log" 2>&1 &
  worker_pids+=($!)
  pids+=($!)
done

# cli ARGS...: the CLI, run from the client's namespace, bounded.
cli() {
  timeout 180 ip netns exec "$ns_client" "$bin/flatshard" "$@" -c "$coord_addr" "${client_auth[@]}"
}
# json EXPR: evaluates a Python expression over the JSON document on stdin (d).
json() {
  python3 -c 'import json, sys; d = json.load(sys.stdin); print(eval(sys.argv[1]))' "$1"
}

three_registered() {
  local i out
  for i in 0 1 2; do kill -0 "${worker_pids[$i]}" 2>/dev/null || fail "worker w$((i + 1)) exited"; done
  out=$(cli workers --json 2>/dev/null) || return 1
  [[ $(echo "$out" | json 'len(d.get("workers", []))') == 3 ]]
}
wait_until 60 "three workers registered" three_registered

# --- Nothing assumes one host: the addresses the coordinator holds -----------
workers_json=$(cli workers --json)
echo "$workers_json" >"$work/workers.json"
for i in 0 1 2; do
  addr=$(echo "$workers_json" | json "[w['address'] for w in d['workers'] if w['worker_id'] == 'mh-w$((i + 1))'][0]")
  [[ $addr == "${worker_ips[$i]}":* ]] \
    || fail "worker mh-w$((i + 1)) registered address '$addr', want ${worker_ips[$i]}:PORT"
done
if echo "$workers_json" | grep -q '127\.0\.0\.1'; then
  fail "a worker is listed with a loopback address: $workers_json"
fi

# --- The job ----------------------------------------------------------------
job_file=$work/job.yaml
sed -e "s|^name: .*|name: $job|" -e "s|^model: .*|model: $src/examples/mlp.yaml|" \
  -e 's|^world_size: .*|world_size: 3|' -e 's|^  global_batch_size: .*|  global_batch_size: 24|' \
  "$src/examples/mlp-job.yaml" >"$job_file"
cat >>"$job_file" <<'EOF'
recovery:
  spare_wait_s: 1     # no spare will come: shrink after 1 s instead of 5
EOF
if ! grep -q '^world_size: 3$' "$job_file" || ! grep -q '^  global_batch_size: 24$' "$job_file"; then
  fail "could not derive the job file from examples/mlp-job.yaml"
fi

# What FSDP must move per step and rank (docs/plan-json.md): every rank must
# receive the other ranks' shards of every all-gather, and must send its
# gradient contributions to the other ranks' shards in every reduce-scatter,
# whatever the algorithm. These are lower bounds on each worker's veth RX/TX.
plan=$("$bin/flatshard" plan -f "$job_file" --json)
ag_wire=$(echo "$plan" | json 'd["collective_totals_per_step"]["all_gather"]["wire_bytes_per_rank"]')
rs_wire=$(echo "$plan" | json 'd["collective_totals_per_step"]["reduce_scatter"]["wire_bytes_per_rank"]')
total_params=$(echo "$plan" | json 'd["total_params"]')
min_rx=$((train_steps * ag_wire))
min_tx=$((train_steps * rs_wire))

cli job create -f "$job_file" --timeout 120 >"$logs/job-create.log" 2>&1 \
  || { cat "$logs/job-create.log" >&2; fail "job create"; }
log_files+=("$logs/job-create.log")

# link_bytes NS DEV rx|tx
link_bytes() { ip netns exec "$1" cat "/sys/class/net/$2/statistics/$3_bytes"; }
declare -A before
for i in 0 1 2; do
  for dev in eth0 lo; do
    for dir in rx tx; do before[$i.$dev.$dir]=$(link_bytes "${ns_workers[$i]}" $dev $dir); done
  done
done

t0=$(date +%s.%N)
cli train -j "$job" --steps "$train_steps" >"$logs/train-1.log" 2>&1 \
  || { log_files+=("$logs/train-1.log"); fail "train $train_steps steps"; }
t1=$(date +%s.%N)

traffic_report=()
for i in 0 1 2; do
  ns=${ns_workers[$i]}
  rx=$(($(link_bytes "$ns" eth0 rx) - before[$i.eth0.rx]))
  tx=$(($(link_bytes "$ns" eth0 tx) - before[$i.eth0.tx]))
  lo_bytes=$(($(link_bytes "$ns" lo tx) - before[$i.lo.tx]))
  grep -q "host collectives over Gloo/TCP (.*cannot read" "$logs/w$((i + 1)).log" \
    || fail "worker w$((i + 1)) did not fall back to TCP between hosts (no 'host collectives over Gloo/TCP' line)"
  ((rx >= min_rx)) || fail "worker w$((i + 1))'s veth received $rx bytes in $train_steps steps; FSDP needs at least $min_rx"
  ((tx >= min_tx)) || fail "worker w$((i + 1))'s veth sent $tx bytes in $train_steps steps; FSDP needs at least $min_tx"
  # The data plane never takes the loopback (there is no peer behind it here).
  ((lo_bytes * 10 < tx)) \
    || fail "worker w$((i + 1)) moved $lo_bytes bytes over its loopback against $tx over its veth"
  traffic_report+=("w$((i + 1)) rx $((rx / 1024)) KiB tx $((tx / 1024)) KiB lo $((lo_bytes / 1024)) KiB")
done

# --- Checkpoint on the shared volume, verify, train on, load back, FULL ------
cli ckpt save -j "$job" -t sharded -n "$ckpt" >"$logs/ckpt-save.log" 2>&1 \
  || { log_files+=("$logs/ckpt-save.log"); fail "ckpt save"; }
ckpt_dir=$shared/$job/$ckpt
[[ -d $ckpt_dir ]] || fail "no checkpoint directory $ckpt_dir"
for r in 0 1 2; do
  compgen -G "$ckpt_dir/model-rank0000$r-of-00003*" >/dev/null \
    || fail "checkpoint lacks rank $r's model file: $(ls "$ckpt_dir")"
done
"$bin/flatshard" ckpt verify "$ckpt_dir" >"$logs/ckpt-verify.log" 2>&1 \
  || { log_files+=("$logs/ckpt-verify.log"); fail "ckpt verify $ckpt_dir"; }
cli train -j "$job" --steps 2 >"$logs/train-2.log" 2>&1 \
  || { log_files+=("$logs/train-2.log"); fail "train 2 more steps"; }
step=$(cli job status -j "$job" --json | json 'int(d.get("step", 0))')
((step == train_steps + 2)) || fail "after training 2 more steps the job is at step $step"
cli ckpt load -j "$job" "$ckpt" >"$logs/ckpt-load.log" 2>&1 \
  || { log_files+=("$logs/ckpt-load.log"); fail "ckpt load $ckpt"; }
status=$(cli job status -j "$job" --json)
step=$(echo "$status" | json 'int(d.get("step", 0))')
((step == train_steps)) || fail "after loading $ckpt the job is at step $step, want $train_steps"

# A FULL checkpoint: each host's worker writes its part of the same two files
# on the shared volume, and each part verifies. Saved after the load, it is
# of the job's history, and its newest: what the recovery below restores.
full_ckpt=mh-full-5
cli ckpt save -j "$job" -t full -n "$full_ckpt" >"$logs/ckpt-save-full.log" 2>&1 \
  || { log_files+=("$logs/ckpt-save-full.log"); fail "ckpt save -t full"; }
"$bin/flatshard" ckpt verify "$shared/$job/$full_ckpt" >"$logs/ckpt-verify-full.log" 2>&1 \
  || { log_files+=("$logs/ckpt-verify-full.log"); fail "ckpt verify $full_ckpt"; }
grep -q "model.safetensors .*from 3 writers" "$logs/ckpt-verify-full.log" \
  || fail "not every host wrote the FULL model file: $(cat "$logs/ckpt-verify-full.log")"

summon_file=$work/model.safetensors
cli summon -j "$job" -o "$summon_file" >"$logs/summon.log" 2>&1 \
  || { log_files+=("$logs/summon.log"); fail "summon"; }
# safetensors: an 8-byte little-endian header length, a JSON header, the data.
summoned=$(python3 - "$summon_file" <<'EOF'
import json, math, struct, sys
with open(sys.argv[1], "rb") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(n))
print(sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__"))
EOF
)
((summoned == total_params)) || fail "summoned $summoned parameters, the model has $total_params"

# Every client call reached the coordinator from the client's own address.
grep -q "peer=ipv4:$client_ip:.*call=SaveCheckpoint target=$job/$ckpt result=OK" "$work/audit.log" \
  || fail "the audit log has no SaveCheckpoint from $client_ip: $(tail -n 5 "$work/audit.log")"

seconds() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# --- A worker fails ------------------------------------------------------------
# docs/fault-tolerance.md: its heartbeats stop, the coordinator probes the
# epoch's members, finds no spare within spare_wait_s and shrinks to the largest
# world size the spec accepts (2: it divides the global batch of 24), restoring
# the newest checkpoint of the job's history (the FULL one saved after the
# load, step 5). State READY, restarts 1.
victim=2  # w3
victim_id=mh-w$((victim + 1))
victim_rank=$(cli workers -j "$job" --json \
  | json "[w['rank'] for w in d['workers'] if w['worker_id'] == '$victim_id'][0]")
((victim_rank >= 0 && victim_rank < 3)) || fail "worker $victim_id has rank $victim_rank in the job"
ip netns pids "${ns_workers[$victim]}" | grep -qx "${worker_pids[$victim]}" \
  || fail "worker $victim_id (pid ${worker_pids[$victim]}) is not in namespace ${ns_workers[$victim]}"
kill -KILL "${worker_pids[$victim]}"
killed_at=$(date +%s.%N)
wait "${worker_pids[$victim]}" 2>/dev/null || true  # reaped here: bash reports no "Killed" job

recovered() {
  status=$(cli job status -j "$job" --json 2>/dev/null) || return 1
  local state restarts
  state=$(echo "$status" | json 'd.get("state", "")')
  restarts=$(echo "$status" | json 'int(d.get("restarts", 0))')
  [[ $state == FAILED ]] && fail "the job FAILED instead of recovering: $(echo "$status" | json 'd.get("failure")')"
  [[ $state == READY && $restarts -ge 1 ]]
}
wait_until 90 "the job recovering from the loss of rank $victim_rank ($victim_id)" recovered
recovered_at=$(date +%s.%N)
echo "$status" >"$work/status-after-recovery.json"
check() {  # check EXPR WANT WHAT
  local got
  got=$(echo "$status" | json "$1")
  [[ $got == "$2" ]] || fail "after the recovery $3 is '$got', want '$2' (status: $(echo "$status" \
    | json '{k: d.get(k) for k in ("state", "step", "failure", "restarts", "world_size", "last_recovery")}'))"
}
check 'int(d["restarts"])' 1 "restarts"
check 'd["world_size"]' 2 "the world size"
check 'd["last_recovery"]["failed_ranks"]' "[$victim_rank]" "the failed ranks"
check 'int(d["last_recovery"]["resumed_step"])' "$train_steps" "the resumed step"
# The newest checkpoint of the job's history: the FULL one the three hosts
# wrote together, loaded at world size 2.
check 'd["last_recovery"]["checkpoint"]' "$full_ckpt" "the checkpoint restored"
cli job status -j "$job" | grep -q "recovered:" || fail "job status does not show the recovery"

# The survivors train on across the bridge at world size 2.
cli train -j "$job" --steps 1 >"$logs/train-3.log" 2>&1 \
  || { log_files+=("$logs/train-3.log"); fail "train after the recovery"; }
step=$(cli job status -j "$job" --json | json 'int(d.get("step", 0))')
((step == train_steps + 1)) || fail "after the recovery and 1 step the job is at step $step"

echo "multi_host_netns_test: coordinator $coord_addr, client $client_ip, workers ${worker_ips[*]} (namespaces $tag-*, bridged, mutual TLS + tokens)"
echo "  workers registered at their own addresses: $(echo "$workers_json" | json "', '.join(w['address'] for w in d['workers'])")"
echo "  trained $train_steps steps at world size 3 in $(seconds "$t0" "$t1") s; veth traffic per worker (need rx >= $((min_rx / 1024)) KiB, tx >= $((min_tx / 1024)) KiB):"
for line in "${traffic_report[@]}"; do echo "    $line"; done
echo "  SHARDED checkpoint $ckpt (3 ranks' files on the shared volume) and FULL $full_ckpt (3 ranks' parts of 2 files) verified; trained to step $((train_steps + 2)), loaded back to step $train_steps; summoned $summoned parameters"
echo "  SIGKILL of $victim_id (rank $victim_rank): READY at world size 2 from $full_ckpt after $(seconds "$killed_at" "$recovered_at") s, then trained to step $((train_steps + 1))"
echo "  total $(($(date +%s) - started)) s; PASS"
