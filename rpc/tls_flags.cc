#include "rpc/tls_flags.h"

namespace flatshard {

void AddTlsFlags(CLI::App& app, TlsFiles& files, const std::string& peer) {
  app.add_option("--tls-cert", files.cert,
                 "PEM certificate this process presents (env FLATSHARD_TLS_CERT); with "
                 "--tls-key, its channels and server use TLS")
      ->envname("FLATSHARD_TLS_CERT");
  app.add_option("--tls-key", files.key, "PEM private key of --tls-cert (env FLATSHARD_TLS_KEY)")
      ->envname("FLATSHARD_TLS_KEY");
  app.add_option("--tls-ca", files.ca,
                 "PEM CA certificate that " + peer +
                     " must be signed by (env FLATSHARD_TLS_CA); a server given one requires "
                     "client certificates (mutual TLS)")
      ->envname("FLATSHARD_TLS_CA");
}

}  // namespace flatshard
