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
#include <string_view>

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

// The DNS name the coordinator's and the workers' certificates carry beside
// their hosts: the identity in the reserved domain .invalid (RFC 2606), so
// that it is never a host anyone dials or names in --hosts. A Python client,
// which cannot read a server's common name, dials the coordinator by it
// (client/python/flatshard/cluster.py).
std::string RoleHostName(std::string_view identity);

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

// A client's credentials for dialing the part whose identity (above) is
// `server_identity`: kCoordinatorIdentity for clients and workers,
// kWorkerIdentity for the coordinator. With a cluster CA (tls->ca_pem) the
// server's certificate must carry that common name and cover the host dialed;
// a server of another role fails the handshake (the call: UNAVAILABLE) before
// any call, and so any token, is sent. Against the system's roots (no CA) only
// the host is checked: such CAs name hosts, not flatshard's roles.
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const TlsMaterial* tls,
                                                             std::string_view server_identity);

// The common name of the verified client certificate of a call; empty for a
// plaintext call or one without a client certificate.
std::string PeerCommonName(const grpc::ServerContext& context);

}  // namespace flatshard

#endif  // FLATSHARD_RPC_TLS_CREDENTIALS_H_
