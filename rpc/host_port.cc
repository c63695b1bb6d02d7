#include "rpc/host_port.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace flatshard {

std::string JoinHostPort(absl::string_view host, int port) {
  const std::string bare = BareHost(host);
  if (absl::StrContains(bare, ':')) return absl::StrCat("[", bare, "]:", port);
  return absl::StrCat(bare, ":", port);
}

std::string BareHost(absl::string_view host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host.remove_prefix(1);
    host.remove_suffix(1);
  }
  return std::string(host);
}

}  // namespace flatshard
