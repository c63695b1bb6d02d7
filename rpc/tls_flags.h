// The --tls-cert / --tls-key / --tls-ca flags every flatshard binary takes,
// with the FLATSHARD_TLS_* environment variables as their defaults.
#ifndef FLATSHARD_RPC_TLS_FLAGS_H_
#define FLATSHARD_RPC_TLS_FLAGS_H_

#include "CLI/CLI.hpp"
#include "rpc/tls_credentials.h"

namespace flatshard {

// `peer` names who the CA verifies, for the help text ("the coordinator",
// "clients and workers").
void AddTlsFlags(CLI::App& app, TlsFiles& files, const std::string& peer);

}  // namespace flatshard

#endif  // FLATSHARD_RPC_TLS_FLAGS_H_
