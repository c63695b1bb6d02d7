#!/bin/sh
# compose.yaml's one-shot `certs` service: a cluster CA, the certificates and a
# token, each role's copy in a volume of its own, so that a worker never holds
# the coordinator's key and no running service holds the CA's.
#   FLATSHARD_CERT_HOSTS=coordinator,worker-0,... init-secrets.sh
# Idempotent: a later `docker compose up` keeps the CA and the token; a changed
# host list issues a new CA (certs init refuses to overwrite one, and a
# certificate's hosts are fixed), after which every service must be recreated.
set -eu
umask 077
hosts=${FLATSHARD_CERT_HOSTS:?set FLATSHARD_CERT_HOSTS to the names the daemons are dialed at}
tls=/var/lib/flatshard/tls

if [ -f "$tls/ca/ca.pem" ] && [ "$(cat "$tls/ca/hosts" 2>/dev/null || true)" != "$hosts" ]; then
  echo "init-secrets: the hosts changed to $hosts: issuing a new CA" \
    "(run: docker compose up -d --force-recreate)"
  rm -f "$tls"/ca/*
fi
if [ ! -f "$tls/ca/ca.pem" ]; then
  flatshard certs init "$tls/ca" --hosts "$hosts"
  printf '%s\n' "$hosts" >"$tls/ca/hosts"
fi

cp "$tls/ca/ca.pem" "$tls/ca/coordinator.pem" "$tls/ca/coordinator-key.pem" "$tls/coordinator/"
cp "$tls/ca/ca.pem" "$tls/ca/worker.pem" "$tls/ca/worker-key.pem" "$tls/worker/"
cp "$tls/ca/ca.pem" "$tls/ca/admin.pem" "$tls/ca/admin-key.pem" "$tls/client/"

# Under mutual TLS the admin certificate alone is an admin. The operator
# token gives a client holding another certificate (the worker's, say) the
# operator role: train, checkpoints, but no job creation or deletion.
if [ ! -s "$tls/coordinator/tokens" ]; then
  flatshard token create --name operator --role operator \
    --tokens-file "$tls/coordinator/tokens" >"$tls/client/operator.token"
fi
echo "init-secrets: certificates for $hosts ready"
