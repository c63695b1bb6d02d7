// The security files of a local cluster (`flatshard up --tls`, and the tests
// that start secured clusters): a CA and certificates made once in a
// directory and reused, a fresh admin token and worker join token per start,
// and the flags that hand them to the coordinator, the workers and clients.
#ifndef FLATSHARD_CLIENT_CLUSTER_SECURITY_H_
#define FLATSHARD_CLIENT_CLUSTER_SECURITY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "rpc/certificate_renewal.h"
#include "rpc/tls_credentials.h"

#include "client/flatshard_client.h"

namespace flatshard {

struct ClusterSecurity {
  std::string dir;
  std::string admin_token;       // also in admin.token (mode 0600)
  std::string join_token;        // also in join.token
  std::string tokens_file;       // "tokens": their SHA-256s, roles admin and worker
  std::string admin_token_file;  // "admin.token"
  TlsFiles coordinator;
  TlsFiles worker;
  TlsFiles admin;
  // The certificates renewed this start, and why ("ca": a new CA, and every
  // certificate with it).
  std::vector<RenewedCertificate> renewed;

  // Mutual TLS, the tokens file and an audit log for the coordinator.
  std::vector<std::string> CoordinatorFlags() const;
  // Mutual TLS and the join token file for a worker.
  std::vector<std::string> WorkerFlags() const;
  // An admin client: its certificate and the admin token.
  CoordinatorTarget AdminTarget(const std::string& address) const;
};

// Certificates are created in `dir` when it holds none (for `hosts` besides
// localhost and 127.0.0.1), else reused, renewed from the same CA where they
// need it (rpc/certificate_renewal.h: expiring within 30 days, other hosts,
// no role name); tokens are made fresh every time.
absl::StatusOr<ClusterSecurity> PrepareClusterSecurity(const std::string& dir,
                                                       const std::vector<std::string>& hosts = {});

}  // namespace flatshard

#endif  // FLATSHARD_CLIENT_CLUSTER_SECURITY_H_
