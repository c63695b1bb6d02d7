// Safe defaults for where a daemon listens: plaintext and unauthenticated is
// allowed on loopback only. Anything reachable from another host must be
// served with TLS (and, for the coordinator, authenticated callers), unless
// the operator says --insecure, which then warns on every start.
#ifndef FLATSHARD_RPC_LISTEN_POLICY_H_
#define FLATSHARD_RPC_LISTEN_POLICY_H_

#include <string>

#include "absl/status/status.h"

namespace flatshard {

// True for 127.0.0.0/8, ::1 and "localhost" hosts of a "host:port" address.
// 0.0.0.0, [::] and every other host are reachable from elsewhere.
bool IsLoopbackAddress(const std::string& address);

// FAILED_PRECONDITION naming `flag` and `missing` (what a safe start needs)
// when `address` is not loopback, `secured` is false and `insecure` is not
// set; with `insecure` it logs a warning instead.
absl::Status CheckListenExposure(const std::string& flag, const std::string& address, bool secured,
                                 const std::string& missing, bool insecure);

}  // namespace flatshard

#endif  // FLATSHARD_RPC_LISTEN_POLICY_H_
