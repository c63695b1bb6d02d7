#!/bin/sh
# compose.yaml's one-shot `certs` service: a cluster CA, the certificates and a
# token, each role's copy in a volume of its own, so that a worker never holds
# the coordinator's key and no running service holds the CA's.
#   FLATSHARD_CERT_HOSTS=coordinator,worker-0,... init-secrets.sh
# Idempotent: a later `docker compose up` keeps the CA and the token, and
# renews from that CA a certificate that expires within 30 days, names other
# hosts than FLATSHARD_CERT_HOSTS, or lacks its role's name (`flatshard certs
# renew`); the services then need recreating (docker compose up -d
# --force-recreate) to take it. A CA in its last 30 days (or past them) is
# replaced by a new one with every certificate; the old is kept as ca.pem.old.
set -eu
umask 077
hosts=${FLATSHARD_CERT_HOSTS:?set FLATSHARD_CERT_HOSTS to the names the daemons are dialed at}
tls=/var/lib/flatshard/tls

if [ -f "$tls/ca/ca.pem" ]; then
  flatshard certs renew "$tls/ca" --hosts "$hosts" --new-ca-if-needed
else
  flatshard certs init "$tls/ca" --hosts "$hosts"
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
