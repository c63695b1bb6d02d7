#include "worker/comm/gloo_mesh_context.h"

#include <algorithm>
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

using gloo::transport::tcp::Address;

bool GlooPairListens(const std::vector<char>& self, const std::vector<char>& peer) {
  // As Gloo's tcp::Pair::connect decides it: the lower address (IP bytes,
  // then the port as stored, in network order) waits for the higher one.
  const Address self_address(self);
  const Address peer_address(peer);
  const sockaddr_storage& a = self_address.getSockaddr();
  const sockaddr_storage& b = peer_address.getSockaddr();
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

void GlooMeshContext::ThrowIfAbortedLocked() const {
  if (aborted_) throw gloo::IoException("aborted: " + reason_);
}

void GlooMeshContext::ConnectFullMesh(gloo::rendezvous::Store& store,
                                      const std::shared_ptr<gloo::transport::Device>& device) {
  std::shared_ptr<gloo::transport::Context> transport = device->createContext(rank, size);
  transport->setTimeout(getTimeout());
  std::vector<std::vector<char>> own(static_cast<size_t>(size));
  std::vector<char> published;
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    const std::vector<char> bytes = transport->createPair(peer)->address().bytes();
    own[static_cast<size_t>(peer)] = bytes;
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
      const bool listens = GlooPairListens(own[static_cast<size_t>(peer)], address);
      // The pair's errors name its peer by this address when this rank
      // connects to it; by the peer's host when it accepts (gloo_error_peer.h).
      pair_peers_[static_cast<size_t>(peer)] = {Address(address).str(), listens};
      // Last: a phase other than kNotYet promises the connect() below, which
      // ends it (Abort waits for that).
      phases_[static_cast<size_t>(peer)] = listens ? Phase::kListening : Phase::kConnecting;
    }
    try {
      transport->getPair(peer)->connect(address);
    } catch (const std::exception&) {
      std::lock_guard<std::mutex> lock(mu_);
      phases_[static_cast<size_t>(peer)] = Phase::kDone;
      connected_.notify_all();
      ThrowIfAbortedLocked();  // an abort's closed pair is not the peer's failure
      unreachable_peer_ = peer;
      throw;
    }
    std::lock_guard<std::mutex> lock(mu_);
    phases_[static_cast<size_t>(peer)] = Phase::kDone;
    connected_.notify_all();
    // A pair closed by Abort returns from connect() as if connected.
    ThrowIfAbortedLocked();
  }
  std::lock_guard<std::mutex> lock(mu_);
  // Aborted after the last pair's check: the rendezvous ends here.
  ThrowIfAbortedLocked();
  // From here the pairs are the communicator's to close (gloo::Context),
  // once its handshake has confirmed them (GlooCommunicator::ConfirmMesh).
  connecting_.reset();
  device_ = device;
  transportContext_ = std::move(transport);
}

void GlooMeshContext::Abort(const std::string& reason) {
  std::unique_lock<std::mutex> lock(mu_);
  if (aborted_) return;
  aborted_ = true;
  reason_ = reason;
  if (connecting_ == nullptr) return;
  // The pair whose connect() waits on the listening side, if any (one at a
  // time): closing it ends the wait, since Pair::close takes the pair's lock,
  // which connect() lets go of while it waits. Nothing else is closed here.
  // Pair::close resets the connection (SO_LINGER 0), and closing a listening
  // socket resets the connections queued on it. A peer that has not yet
  // accepted its end of such a connection dies of the reset when it does
  // (GlooPairListens); a connecting peer dies only of a reset that lands
  // between its two checks of its end (before them, it sees the error). A pair done connecting is
  // therefore left to close when the transport context is destroyed, after ConnectFullMesh has
  // thrown: without a reset, or with one only if its peer has sent on it,
  // which a peer does only once it has checked its end. The listening pair
  // first gets a moment for Gloo's transport thread to accept a connection
  // already queued on it, which ends connect() as a connection does.
  const auto listening = std::find(phases_.begin(), phases_.end(), Phase::kListening);
  if (listening == phases_.end()) return;
  const auto peer = static_cast<size_t>(listening - phases_.begin());
  connected_.wait_for(lock, absl::ToChronoMilliseconds(kAcceptGrace),
                      [&] { return phases_[peer] != Phase::kListening; });
  if (phases_[peer] == Phase::kListening) connecting_->getPair(static_cast<int>(peer))->close();
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
