#include "worker/comm/gloo_mesh_context.h"

#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <string_view>

#include <gloo/common/error.h>
#include <gloo/transport/context.h>
#include <gloo/transport/tcp/address.h>
#include <netinet/in.h>

namespace flatshard {
namespace {

using gloo::transport::tcp::Address;

// Which side of a pair listens, decided as Gloo's tcp::Pair::connect decides
// it: the lower address (IP bytes, then the port as stored, in network
// order) waits for the higher one to connect.
bool Listens(const Address& self, const Address& peer) {
  const sockaddr_storage& a = self.getSockaddr();
  const sockaddr_storage& b = peer.getSockaddr();
  int order = 0;
  if (a.ss_family == AF_INET && b.ss_family == AF_INET) {
    const auto* sa = reinterpret_cast<const sockaddr_in*>(&a);
    const auto* sb = reinterpret_cast<const sockaddr_in*>(&b);
    order = std::memcmp(&sa->sin_addr, &sb->sin_addr, sizeof(in_addr));
    if (order == 0) order = static_cast<int>(sa->sin_port) - static_cast<int>(sb->sin_port);
  } else if (a.ss_family == AF_INET6 && b.ss_family == AF_INET6) {
    const auto* sa = reinterpret_cast<const sockaddr_in6*>(&a);
    const auto* sb = reinterpret_cast<const sockaddr_in6*>(&b);
    order = std::memcmp(&sa->sin6_addr, &sb->sin6_addr, sizeof(in6_addr));
    if (order == 0) order = static_cast<int>(sa->sin6_port) - static_cast<int>(sb->sin6_port);
  } else {
    return false;  // connect() refuses the pair before it touches the socket
  }
  return order < 0;
}

}  // namespace

void GlooMeshContext::ThrowIfAbortedLocked() const {
  if (aborted_) throw gloo::IoException("aborted: " + reason_);
}

void GlooMeshContext::ConnectFullMesh(gloo::rendezvous::Store& store,
                                      const std::shared_ptr<gloo::transport::Device>& device) {
  std::shared_ptr<gloo::transport::Context> transport = device->createContext(rank, size);
  transport->setTimeout(getTimeout());
  std::vector<Address> own(static_cast<size_t>(size));
  std::vector<char> published;
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    const std::vector<char> bytes = transport->createPair(peer)->address().bytes();
    own[static_cast<size_t>(peer)] = Address(bytes);
    published.insert(published.end(), bytes.begin(), bytes.end());
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ThrowIfAbortedLocked();
    connecting_ = transport;
    phases_.assign(static_cast<size_t>(size), Phase::kNotYet);
    pair_peers_.assign(static_cast<size_t>(size), GlooPairPeer());
  }
  store.set(std::to_string(rank), published);
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    const std::string key = std::to_string(peer);
    store.wait({key}, getTimeout());
    const std::vector<char> theirs = store.get(key);
    // Each rank publishes one address per other rank, in rank order.
    const size_t width = theirs.size() / static_cast<size_t>(size - 1);
    const size_t slot = static_cast<size_t>(rank < peer ? rank : rank - 1);
    if (width == 0 || theirs.size() % static_cast<size_t>(size - 1) != 0) {
      throw gloo::IoException("rank " + key + " published " + std::to_string(theirs.size()) +
                              " address bytes for " + std::to_string(size - 1) + " peers");
    }
    const std::vector<char> address(
        theirs.begin() + static_cast<std::ptrdiff_t>(slot * width),
        theirs.begin() + static_cast<std::ptrdiff_t>((slot + 1) * width));
    {
      std::lock_guard<std::mutex> lock(mu_);
      ThrowIfAbortedLocked();
      const bool listens = Listens(own[static_cast<size_t>(peer)], Address(address));
      phases_[static_cast<size_t>(peer)] = listens ? Phase::kListening : Phase::kConnecting;
      // The pair's errors name its peer by this address when this rank
      // connects to it; by the peer's host when it accepts (gloo_error_peer.h).
      pair_peers_[static_cast<size_t>(peer)] = {Address(address).str(), listens};
    }
    try {
      transport->getPair(peer)->connect(address);
    } catch (const std::exception&) {
      std::lock_guard<std::mutex> lock(mu_);
      ThrowIfAbortedLocked();  // an abort's closed pair is not the peer's failure
      unreachable_peer_ = peer;
      throw;
    }
    std::lock_guard<std::mutex> lock(mu_);
    phases_[static_cast<size_t>(peer)] = Phase::kDone;
    // A pair closed by Abort returns from connect() as if connected.
    ThrowIfAbortedLocked();
  }
  std::lock_guard<std::mutex> lock(mu_);
  // Aborted after the last pair's check: its pairs may be closed.
  ThrowIfAbortedLocked();
  // From here the communicator's Abort closes the pairs (gloo::Context).
  connecting_.reset();
  device_ = device;
  transportContext_ = std::move(transport);
}

void GlooMeshContext::Abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) return;
  aborted_ = true;
  reason_ = reason;
  if (connecting_ == nullptr) return;
  for (int peer = 0; peer < size; ++peer) {
    const Phase phase = phases_[static_cast<size_t>(peer)];
    if (peer == rank || phase == Phase::kNotYet || phase == Phase::kConnecting) continue;
    // Pair::close takes the pair's lock, which connect() lets go of while it
    // waits; the wait then ends.
    connecting_->getPair(peer)->close();
  }
}

std::optional<int> GlooMeshContext::unreachable_peer() const {
  std::lock_guard<std::mutex> lock(mu_);
  return unreachable_peer_;
}

std::optional<int> GlooMeshContext::PeerNamedIn(std::string_view message) const {
  std::lock_guard<std::mutex> lock(mu_);
  return PeerNamedInGlooError(message, pair_peers_);
}

bool GlooMeshContext::aborted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return aborted_;
}

}  // namespace flatshard
