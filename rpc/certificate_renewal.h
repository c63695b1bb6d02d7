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
// file is not its key (a renewal cut short between the two files), and none
// is made to outlive the CA. FAILED_PRECONDITION when the CA is past its
// validity (make a new one with `certs init`) or ca-key.pem is not its key;
// INVALID_ARGUMENT when valid_for is not more than expiring_within, or for a
// bad host (CertificateHost); NOT_FOUND naming a file that is missing.
absl::StatusOr<RenewalReport> RenewClusterCertificates(const std::string& directory,
                                                       const RenewalOptions& options);

}  // namespace flatshard

#endif  // FLATSHARD_RPC_CERTIFICATE_RENEWAL_H_
