// Tests PeerNamedInGlooError (worker/comm/gloo_error_peer.h) on the messages
// Debian's Gloo writes. With real processes:
// GlooCommunicatorTest.ALinkThatFailsAfterConnectingNamesItsPeer.
#include "worker/comm/gloo_error_peer.h"

#include <optional>
#include <vector>

#include <gtest/gtest.h>

namespace flatshard {
namespace {

constexpr char kReset[] =
    "[./gloo/transport/tcp/pair.cc:589] Read error [10.0.0.2]:41234: Connection reset by peer";

GlooPairPeer Connected(const char* address) { return {address, /*accepted=*/false}; }
GlooPairPeer Accepted(const char* address) { return {address, /*accepted=*/true}; }

TEST(GlooErrorPeerTest, APeerItConnectedToIsNamedByItsPublishedAddress) {
  // Rank 0 (empty: itself) and peers on two hosts, two of them on one.
  const std::vector<GlooPairPeer> peers = {{},
                                           Connected("[10.0.0.2]:41234"),
                                           Connected("[10.0.0.2]:41300"),
                                           Connected("[10.0.0.3]:41234")};
  EXPECT_EQ(PeerNamedInGlooError(kReset, peers), std::optional<int>(1));
  EXPECT_EQ(PeerNamedInGlooError("Connection closed by peer [10.0.0.3]:41234", peers),
            std::optional<int>(3));
  // A port that is a prefix of another's: "[10.0.0.2]:4123" is not "[10.0.0.2]:41234".
  const std::vector<GlooPairPeer> prefix = {
      {}, Connected("[10.0.0.2]:4123"), Connected("[10.0.0.2]:41234")};
  EXPECT_EQ(PeerNamedInGlooError(kReset, prefix), std::optional<int>(2));
  EXPECT_EQ(PeerNamedInGlooError("Read error [10.0.0.2]:4123: reset", prefix),
            std::optional<int>(1));
}

TEST(GlooErrorPeerTest, APeerThatConnectedToItIsNamedByItsHostWhenAloneThere) {
  // The peer's side of an accepted socket: a port no one published.
  const std::vector<GlooPairPeer> alone = {
      Accepted("[10.0.0.2]:41300"), {}, Accepted("[10.0.0.3]:41234")};
  EXPECT_EQ(PeerNamedInGlooError(kReset, alone), std::optional<int>(0));
  const std::vector<GlooPairPeer> shared = {
      {}, Accepted("[10.0.0.2]:41300"), Accepted("[10.0.0.2]:41400")};
  EXPECT_EQ(PeerNamedInGlooError(kReset, shared), std::nullopt);
  const std::vector<GlooPairPeer> v6 = {{}, Accepted("[::1]:41300")};
  EXPECT_EQ(PeerNamedInGlooError("Read error [::1]:50000: Connection reset by peer", v6),
            std::optional<int>(1));
  // Peer 2 connected to this rank from the port peer 1 of its host had
  // published for its pair with this rank, and closed when it connected out
  // itself: the full address is matched only for the pairs this rank
  // connected, so peer 1 is not named for peer 2's failure (nor is peer 2,
  // one of two on that host).
  const std::vector<GlooPairPeer> reused = {
      {}, Accepted("[10.0.0.2]:41234"), Accepted("[10.0.0.2]:41300")};
  EXPECT_EQ(PeerNamedInGlooError(kReset, reused), std::nullopt);
}

TEST(GlooErrorPeerTest, NoPeerWhenTheMessageNamesNone) {
  const std::vector<GlooPairPeer> peers = {{}, Connected("[10.0.0.2]:41234")};
  EXPECT_EQ(PeerNamedInGlooError("Timed out waiting 60000ms for recv operation to complete", peers),
            std::nullopt);
  EXPECT_EQ(PeerNamedInGlooError(kReset, {}), std::nullopt);
  EXPECT_EQ(PeerNamedInGlooError("", peers), std::nullopt);
  // A connected peer's host alone is not its address.
  EXPECT_EQ(PeerNamedInGlooError("Read error [10.0.0.2]:50000: reset", peers), std::nullopt);
}

}  // namespace
}  // namespace flatshard
