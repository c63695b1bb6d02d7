// TLS for every flatshard channel: the --tls-cert / --tls-key / --tls-ca
// files, checked at start with OpenSSL (readable, parseable, key matching the
// certificate, within its validity, signed by the CA) so a bad file stops the
// process with a message naming it rather than failing every handshake later,
// and turned into gRPC server and channel credentials.
//
// A server with a CA requires and verifies client certificates (mutual TLS);
// without one it only proves itself. A client with a CA verifies the server
// against it (else against the system roots) and, with a certificate and key,
// presents them.
#ifndef FLATSHARD_RPC_TLS_CREDENTIALS_H_
#define FLATSHARD_RPC_TLS_CREDENTIALS_H_

#include <memory>
#include <optional>
#include <string>

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_context.h>

#include "absl/status/statusor.h"

namespace flatshard {

// The identities `flatshard certs init` issues, as certificate common names.
// A worker accepts WorkerService calls only from kCoordinatorIdentity (under
// mutual TLS); the coordinator lets kWorkerIdentity register and treats
// kAdminIdentity as an admin client.
inline constexpr char kCoordinatorIdentity[] = "flatshard-coordinator";
inline constexpr char kWorkerIdentity[] = "flatshard-worker";
inline constexpr char kAdminIdentity[] = "flatshard-admin";

// The three flags, as given (paths; empty: not given).
struct TlsFiles {
  std::string cert;
  std::string key;
  std::string ca;

  bool empty() const { return cert.empty() && key.empty() && ca.empty(); }
};

// The checked contents.
struct TlsMaterial {
  std::string cert_pem;  // empty for a client that only verifies
  std::string key_pem;
  std::string ca_pem;       // empty: no client certificates asked (server) /
                            // system roots (client)
  std::string common_name;  // of cert_pem
};

enum class TlsRole { kServer, kClient };

// nullopt when no flag is given (plaintext). INVALID_ARGUMENT naming the flag
// and the file for a missing, unreadable or malformed file, a key that is not
// the certificate's, a certificate outside its validity period or not signed
// by the CA; a server needs a certificate and key, and a key needs a
// certificate (and the reverse).
absl::StatusOr<std::optional<TlsMaterial>> LoadTls(const TlsFiles& files, TlsRole role);

// Plaintext credentials for nullptr.
std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const TlsMaterial* tls);
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const TlsMaterial* tls);

// The common name of the verified client certificate of a call; empty for a
// plaintext call or one without a client certificate.
std::string PeerCommonName(const grpc::ServerContext& context);

}  // namespace flatshard

#endif  // FLATSHARD_RPC_TLS_CREDENTIALS_H_
