// A gloo::Context whose full-mesh connection another thread can abort.
//
// It connects as gloo::rendezvous::Context::connectFullMesh does, with the
// same store keys and values: each rank sets its pairs' listening addresses
// under its rank, then connects to every peer in rank order. Gloo's own keeps
// the pairs in a local until all are up, where nothing can reach them: a rank
// whose peer will never connect (it failed, or its formation was abandoned
// and it moved on) sleeps in Gloo for five rendezvous timeouts, and holds its
// worker's next configure back that long. Here Abort closes the pair that
// waits on the listening side, and ConnectFullMesh throws.
#ifndef FLATSHARD_WORKER_COMM_GLOO_MESH_CONTEXT_H_
#define FLATSHARD_WORKER_COMM_GLOO_MESH_CONTEXT_H_

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <gloo/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/device.h>

#include "absl/time/time.h"

#include "worker/comm/gloo_error_peer.h"

namespace flatshard {

// Whether the end of a pair at `self` waits for the end at `peer` to connect
// to it (the lower address does), given the addresses as pairs publish them
// (Address::bytes()). The waiting end takes the connection from its
// listening socket on Gloo's transport thread, whenever that thread gets to
// it: until then the connecting end must not reset it (Abort).
bool GlooPairListens(const std::vector<char>& self, const std::vector<char>& peer);

class GlooMeshContext : public gloo::Context {
 public:
  GlooMeshContext(int group_rank, int group_size) : gloo::Context(group_rank, group_size) {}

  // Connects a pair to every other rank. Throws as Gloo does
  // (gloo::IoException and its kin); once aborted, gloo::IoException naming
  // the reason. Called once.
  void ConnectFullMesh(gloo::rendezvous::Store& store,
                       const std::shared_ptr<gloo::transport::Device>& device);

  // Ends a ConnectFullMesh in progress soon, or one not yet begun at its
  // start. Thread-safe; the first reason stands. A wait in the store is the
  // store's to abort (Store::Abort). Takes up to kAcceptGrace when a pair
  // waits on the listening side for a peer that does not connect.
  void Abort(const std::string& reason);

  // How long Abort lets Gloo's transport thread accept a connection that may
  // already be queued on the listening pair before it closes that pair.
  static constexpr absl::Duration kAcceptGrace = absl::Milliseconds(250);

  bool aborted() const;
  // The peer (group rank) whose pair failed to connect, once ConnectFullMesh
  // has thrown for that: the connection was refused, timed out, or broke in
  // the handshake. Not set by an abort, nor by a wait in the store.
  std::optional<int> unreachable_peer() const;
  // The peer (group rank) whose pair a Gloo error `message` names, once
  // ConnectFullMesh has connected: a pair that fails later (its peer closed
  // it, exited, or reset it) names the peer by address
  // (PeerNamedInGlooError says when that identifies it).
  std::optional<int> PeerNamedIn(std::string_view message) const;

 private:
  // Where each pair is. Abort closes only a pair whose connect() is on the
  // listening side (it returns when the pair closes, even closed before the
  // call). On the connecting side, a pair closed before connect() has taken
  // its lock makes connect() move the pair backwards, which Gloo answers
  // with std::terminate: that connect() is left to end, at once when the
  // peer's host answers (it accepts or refuses), after the kernel's SYN
  // retries (about 2 minutes) when the host is gone or cut off. A pair done
  // connecting is not closed at all: its peer may not have accepted it yet.
  // kDone: connect() returned, connected or not.
  enum class Phase { kNotYet, kListening, kConnecting, kDone };

  void ThrowIfAbortedLocked() const;

  mutable std::mutex mu_;              // guards all below
  std::condition_variable connected_;  // a pair's connect() returned
  bool aborted_ = false;
  std::string reason_;
  std::shared_ptr<gloo::transport::Context> connecting_;  // its pairs, while they connect
  std::vector<Phase> phases_;                             // by peer rank
  std::optional<int> unreachable_peer_;
  std::vector<GlooPairPeer> pair_peers_;  // by peer rank
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_COMM_GLOO_MESH_CONTEXT_H_
