#include "rpc/listen_policy.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "rpc/host_port.h"
#include "spdlog/spdlog.h"

namespace flatshard {

bool IsLoopbackAddress(const std::string& address) {
  const std::string host = BareHost(address.substr(0, address.rfind(':')));
  return absl::StartsWith(host, "127.") || host == "::1" || host == "localhost";
}

absl::Status CheckListenExposure(const std::string& flag, const std::string& address, bool secured,
                                 const std::string& missing, bool insecure) {
  if (secured || IsLoopbackAddress(address)) return absl::OkStatus();
  if (!insecure) {
    return absl::FailedPreconditionError(
        absl::StrCat(flag, " ", address, " is reachable from other hosts, but ", missing,
                     ": anyone who reaches it could drive or read the cluster. Give them (see "
                     "docs/security.md), or --insecure on a network you trust"));
  }
  spdlog::warn(
      "{} {} is reachable from other hosts without {} (--insecure): anyone who reaches "
      "it can drive the cluster and read the model",
      flag, address, missing);
  return absl::OkStatus();
}

}  // namespace flatshard
