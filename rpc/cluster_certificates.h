// A cluster's certificate authority and the certificates `flatshard certs
// init` issues from it, made with the OpenSSL library (EC P-256 keys, SHA-256
// signatures, X.509 v3 with subjectAltNames for every host a peer dials).
#ifndef FLATSHARD_RPC_CLUSTER_CERTIFICATES_H_
#define FLATSHARD_RPC_CLUSTER_CERTIFICATES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace flatshard {

struct PemCertificate {
  std::string cert_pem;
  std::string key_pem;
};

struct CertificateRequest {
  std::string common_name;
  // DNS names and IP addresses the holder is dialed at (subjectAltName).
  std::vector<std::string> hosts;
  bool is_ca = false;
  // Validity: [now + not_before, now + not_after]. Tests issue expired and
  // not-yet-valid certificates by moving the window.
  absl::Duration not_before = absl::Minutes(-5);
  absl::Duration not_after = absl::Hours(24 * 365);
};

// Self-signed when `issuer` is null (a CA), else signed by it.
absl::StatusOr<PemCertificate> IssueCertificate(const CertificateRequest& request,
                                                const PemCertificate* issuer);

// The files of a cluster: ca.pem (and ca-key.pem, to issue more later),
// coordinator.pem/-key.pem, worker.pem/-key.pem, admin.pem/-key.pem, with
// `hosts` (plus localhost, 127.0.0.1 and ::1) and the role's name
// (RoleHostName) in the coordinator's and workers' subjectAltNames. Keys are written mode 0600.
// ALREADY_EXISTS, writing nothing, when `directory` already holds a CA: reissuing would orphan
// every certificate made from it. The paths written.
// The CA is valid `ca_valid_for` (ten years), the others `valid_for` (a
// year; `flatshard certs renew` issues them again from the same CA).
absl::StatusOr<std::vector<std::string>> WriteClusterCertificates(
    const std::string& directory, const std::vector<std::string>& hosts,
    absl::Duration valid_for = absl::Hours(24 * 365),
    absl::Duration ca_valid_for = absl::Hours(24 * 3650));

// `given` (a --hosts entry) as a certificate names it and gRPC compares it:
// an IP address as inet_ntop writes it, a DNS name trimmed, without IPv6
// brackets or a final dot, in lower case. INVALID_ARGUMENT naming it when it
// is neither, or lies in .invalid (the roles' names: RoleHostName).
absl::StatusOr<std::string> CertificateHost(absl::string_view given);

// The certificate `flatshard certs init` issues for a role (an identity of
// rpc/tls_credentials.h): the admin's names no host (a client); the
// coordinator's and the workers' name localhost, 127.0.0.1, ::1, `hosts` and
// RoleHostName(identity), which a Python client dials them by (grpcio cannot
// check a server's common name as the C++ clients do); hosts as
// CertificateHost writes them, and its errors.
absl::StatusOr<PemCertificate> IssueRoleCertificate(const char* identity,
                                                    const std::vector<std::string>& hosts,
                                                    absl::Duration valid_for,
                                                    const PemCertificate& ca);

// Writes `file`.pem and `file`-key.pem (mode 0600) in `directory` durably and
// appends their paths to `written`.
absl::Status WriteCertificatePair(const std::string& directory, const std::string& file,
                                  const PemCertificate& pem, std::vector<std::string>* written);

}  // namespace flatshard

#endif  // FLATSHARD_RPC_CLUSTER_CERTIFICATES_H_
