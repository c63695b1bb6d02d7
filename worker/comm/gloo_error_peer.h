// Which peer a Gloo pair's error is about, read from its message.
//
// A tcp::Pair that fails after it connected (its peer closed or reset it, or
// exited) throws an error naming the peer by address, "Read error
// [10.0.0.2]:41234: Connection reset by peer", and nothing else: the pair's
// peer rank is not on the exception, and Pair::peer() is protected. What
// address that is depends on which side connected:
// - this rank connected to the peer: the address the peer published in the
//   rendezvous, matched in full;
// - the peer connected to this rank: the peer's side of the accepted
//   socket, its host and a port no one published (which may even be one
//   another peer of that host published and closed since). Only the host is
//   matched, and only among the peers that connected to this rank: the
//   peer is named when it is the only one of them on that host.
// None when the message names no peer, or names it ambiguously.
#ifndef FLATSHARD_WORKER_COMM_GLOO_ERROR_PEER_H_
#define FLATSHARD_WORKER_COMM_GLOO_ERROR_PEER_H_

#include <optional>
#include <string>
#include <string_view>

#include "absl/types/span.h"

namespace flatshard {

// One peer's pair, by peer rank.
struct GlooPairPeer {
  // What the peer published, as Gloo's tcp::Address::str() writes it
  // ("[127.0.0.1]:41234", "[::1]:41234"); empty for this rank itself.
  std::string address;
  bool accepted = false;  // the peer connected to this rank
};

std::optional<int> PeerNamedInGlooError(std::string_view message,
                                        absl::Span<const GlooPairPeer> peers);

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_COMM_GLOO_ERROR_PEER_H_
