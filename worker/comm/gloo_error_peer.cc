#include "worker/comm/gloo_error_peer.h"

#include <cstddef>
#include <vector>

#include "absl/strings/ascii.h"

namespace flatshard {
namespace {

// Whether `message` holds `text` not followed by a digit: "[10.0.0.1]:4123"
// must not match "[10.0.0.1]:41234".
bool Names(std::string_view message, std::string_view text) {
  for (size_t at = message.find(text); at != std::string_view::npos;
       at = message.find(text, at + 1)) {
    const size_t end = at + text.size();
    if (end == message.size() || !absl::ascii_isdigit(static_cast<unsigned char>(message[end]))) {
      return true;
    }
  }
  return false;
}

// "[10.0.0.1]:" of "[10.0.0.1]:4123"; empty when it is not of that form.
std::string_view HostOf(std::string_view address) {
  const size_t close = address.rfind("]:");
  if (address.empty() || address.front() != '[' || close == std::string_view::npos) return {};
  return address.substr(0, close + 2);
}

// The one peer of `peers`, if exactly one.
std::optional<int> TheOne(const std::vector<int>& peers) {
  if (peers.size() != 1) return std::nullopt;
  return peers.front();
}

}  // namespace

std::optional<int> PeerNamedInGlooError(std::string_view message,
                                        absl::Span<const GlooPairPeer> peers) {
  std::vector<int> by_address;
  for (size_t peer = 0; peer < peers.size(); ++peer) {
    const GlooPairPeer& p = peers[peer];
    if (!p.accepted && !p.address.empty() && Names(message, p.address)) {
      by_address.push_back(static_cast<int>(peer));
    }
  }
  if (!by_address.empty()) return TheOne(by_address);
  std::vector<int> by_host;
  for (size_t peer = 0; peer < peers.size(); ++peer) {
    const std::string_view host = HostOf(peers[peer].address);
    if (peers[peer].accepted && !host.empty() && message.find(host) != std::string_view::npos) {
      by_host.push_back(static_cast<int>(peer));
    }
  }
  return TheOne(by_host);
}

}  // namespace flatshard
