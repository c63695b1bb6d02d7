// Which peer a Gloo pair's error is about, read from its message.
//
// A tcp::Pair that fails after it connected (its peer closed or reset it, or
// exited) throws an error naming the peer by address, "Read error
// [10.0.0.2]:41234: Connection reset by peer", and nothing else: the pair's
// peer rank is not on the exception, and Pair::peer() is protected. The
// address is the one the peer published in the rendezvous when this rank
// connected to it; when the peer connected to this rank, it is the peer's
// side of the accepted socket, whose port no one published. So:
// - a peer whose published address appears in full is the one;
// - otherwise a peer whose host appears is the one, when no other peer is
//   on that host (a job with one worker a host; ranks of one host that
//   accepted from each other stay unnamed);
// - none when the message names no peer, or names it ambiguously.
#ifndef FLATSHARD_WORKER_COMM_GLOO_ERROR_PEER_H_
#define FLATSHARD_WORKER_COMM_GLOO_ERROR_PEER_H_

#include <optional>
#include <string>
#include <string_view>

#include "absl/types/span.h"

namespace flatshard {

// `peer_addresses`: by peer rank, as Gloo's tcp::Address::str() writes them
// ("[127.0.0.1]:41234", "[::1]:41234"); empty for this rank itself.
std::optional<int> PeerNamedInGlooError(std::string_view message,
                                        absl::Span<const std::string> peer_addresses);

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_COMM_GLOO_ERROR_PEER_H_
