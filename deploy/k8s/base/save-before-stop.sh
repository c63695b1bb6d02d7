#!/bin/sh
# The workers' preStop hook: save a checkpoint of the job before this worker
# stops (a drain, an eviction, a deleted pod), so that the recovery its
# going away sets off restores this step instead of an older one.
# The job is $FLATSHARD_JOB, else the `job` key of the Secret flatshard-drain
# (mounted at $FLATSHARD_DRAIN_DIR): a mounted Secret follows its updates in
# running pods, where an environment variable would need new pods. No job:
# no checkpoint. The coordinator, TLS and token come from the environment
# the CLI reads (FLATSHARD_COORDINATOR, FLATSHARD_TLS_*, FLATSHARD_TOKEN_FILE:
# the Secret's `token`, role operator, since a worker certificate is no admin).
#
# A drain stops every worker of a node at once, and all of them run this
# hook, so they ask for one checkpoint by one name: drain-<UTC minute>. Of
# hooks racing for it, the first saves it; while training, the others queue
# behind it and are then told the name is taken; while idle, they are told
# the job is busy and try again until it is taken. Either way each one
# waits until the checkpoint exists, so no worker stops in the middle of
# it. It never fails the pod's termination: whatever goes wrong is printed
# and the worker stops as it would have without the hook.
set -u
if [ -z "${FLATSHARD_JOB:-}" ]; then
  FLATSHARD_JOB=$(cat "${FLATSHARD_DRAIN_DIR:-/etc/flatshard/drain}/job" 2>/dev/null || true)
  export FLATSHARD_JOB
fi
[ -n "$FLATSHARD_JOB" ] || exit 0
name="drain-$(date -u +%Y%m%d-%H%M)"
deadline=$(($(date +%s) + ${FLATSHARD_SAVE_TIMEOUT:-540}))
while :; do
  if out=$(flatshard ckpt save -n "$name" 2>&1); then
    echo "$out"
    exit 0
  fi
  if flatshard ckpt ls 2>/dev/null | grep -q "^${name} "; then
    echo "save-before-stop: checkpoint $name saved by another worker's hook"
    exit 0
  fi
  case $out in
    *"is busy"*) ;;
    *)
      echo "save-before-stop: no checkpoint: $out" >&2
      exit 0
      ;;
  esac
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "save-before-stop: $name not saved within ${FLATSHARD_SAVE_TIMEOUT:-540}s: $out" >&2
    exit 0
  fi
  sleep 2
done
