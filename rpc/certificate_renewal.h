// Renewing the certificates of a cluster directory (`flatshard certs renew`,
// and `flatshard up --tls` at every start) from the CA already there, so that
// every certificate the CA signed stays valid: the coordinator's, the workers'
// and the admin's are issued again when they expire soon, name other hosts
// than asked, or lack their role's name (made before clients checked it).
#ifndef FLATSHARD_RPC_CERTIFICATE_RENEWAL_H_
#define FLATSHARD_RPC_CERTIFICATE_RENEWAL_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace flatshard {

// What a certificate says, as far as renewal asks.
struct CertificateFacts {
  std::string common_name;
  // Its subjectAltNames: DNS names as written, IP addresses in the form
  // inet_ntop writes them.
  std::vector<std::string> names;
  absl::Time not_after;
};

absl::StatusOr<CertificateFacts> ReadCertificateFacts(const std::string& cert_pem);

struct RenewalOptions {
  // The hosts the coordinator and workers are dialed at; empty: the hosts
  // their certificates name now.
  std::vector<std::string> hosts;
  absl::Duration valid_for = absl::Hours(24 * 365);
  // A certificate that expires within this is renewed.
  absl::Duration expiring_within = absl::Hours(24 * 30);
  // Renew every one, whatever it says.
  bool all = false;
  // A CA that expired, expires within expiring_within, or whose key file is
  // not its key is replaced by a new one (ten years) with every certificate
  // (the old CA kept as ca.pem.old, ca-key.pem.old), instead of refused. For
  // directories only flatshard uses (`flatshard up --tls`, the compose
  // `certs` service): certificates copied elsewhere stop working.
  bool new_ca_if_needed = false;
};

struct RenewedCertificate {
  std::string file;  // "coordinator", "worker" or "admin"
  std::string why;   // "expires 2027-01-03", "lacks the name flatshard-worker", ...
};

struct RenewalReport {
  std::vector<RenewedCertificate> renewed;
  absl::Time ca_not_after;  // no certificate it signs is valid past this
};

// Renews what needs it in `directory` (ca.pem, ca-key.pem and the files
// WriteClusterCertificates made), each certificate with its key, written
// durably; nothing else changes. A certificate is also renewed when its key
// file is missing or not its key (a renewal cut short between the two files)
// or ca.pem did not sign it, and none is made to outlive the CA.
// FAILED_PRECONDITION when the CA expired or ca-key.pem is not its key,
// unless new_ca_if_needed; INVALID_ARGUMENT when valid_for is not more than
// expiring_within, or for a bad host (CertificateHost); NOT_FOUND naming a
// missing file.
absl::StatusOr<RenewalReport> RenewClusterCertificates(const std::string& directory,
                                                       const RenewalOptions& options);

}  // namespace flatshard

#endif  // FLATSHARD_RPC_CERTIFICATE_RENEWAL_H_
