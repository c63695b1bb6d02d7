// GlooCommunicator's internals shared by its translation units
// (gloo_communicator.cc, gloo_ring.cc, gloo_handshake.cc): ActiveBuffer, the
// registration that lets Abort() wake a collective's waits, what an aborted
// wait throws, and Guard, which turns what Gloo throws into a Status.
// Not for use outside worker/comm.
#ifndef FLATSHARD_WORKER_COMM_GLOO_ACTIVE_BUFFER_H_
#define FLATSHARD_WORKER_COMM_GLOO_ACTIVE_BUFFER_H_

#include <algorithm>
#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

#include "core/status_payloads.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/gloo_mesh_context.h"

namespace flatshard {
namespace gloo_internal {

inline std::chrono::milliseconds Millis(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// Group rank `peer`'s rank in the job's world.
inline int WorldRank(const GlooOptions& options, int peer) {
  return options.world_ranks.empty() ? peer : options.world_ranks[static_cast<size_t>(peer)];
}

// A wait that Abort() interrupted.
struct CollectiveAborted : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace gloo_internal

// The unbound buffers of the collective in flight, so Abort() can wake their
// waits (abortWaitRecv/abortWaitSend); registering after an abort throws.
class GlooCommunicator::ActiveBuffer {
 public:
  ActiveBuffer(GlooCommunicator& comm, void* data, size_t bytes)
      : comm_(comm), buffer_(comm.context_->createUnboundBuffer(data, bytes)) {
    std::lock_guard<std::mutex> lock(comm_.abort_mu_);
    if (comm_.aborted_) throw gloo_internal::CollectiveAborted(comm_.abort_reason_);
    comm_.active_.push_back(buffer_.get());
  }
  ~ActiveBuffer() {
    // Unwinding from a failure (a peer gone, a wait given up): Gloo's
    // transport thread may still be signalling this buffer or completing it
    // (Pair::signalException wakes every pending buffer of the pair under the
    // pair's lock). Closing the pairs takes that lock, so once it returns the
    // buffer can be destroyed; the communicator is unusable after an error
    // anyway. Idempotent, as later buffers of the same unwinding find.
    if (std::uncaught_exceptions() > unwinding_at_start_) {
      try {
        comm_.ClosePairs();
      } catch (const std::exception&) {  // a destructor must not throw while unwinding
      }
    }
    std::lock_guard<std::mutex> lock(comm_.abort_mu_);
    std::erase(comm_.active_, buffer_.get());
  }
  ActiveBuffer(const ActiveBuffer&) = delete;
  ActiveBuffer& operator=(const ActiveBuffer&) = delete;

  gloo::transport::UnboundBuffer* operator->() { return buffer_.get(); }
  void WaitRecv() {
    if (!buffer_->waitRecv(gloo_internal::Millis(comm_.options_.timeout))) Aborted();
  }
  void WaitSend() {
    if (!buffer_->waitSend(gloo_internal::Millis(comm_.options_.timeout))) Aborted();
  }

 private:
  [[noreturn]] void Aborted() {
    // The wait was woken (Abort) or timed out, but the transport thread may
    // still be writing into this buffer or completing it: with the pairs
    // closed it no longer can, so the caller may free the memory at once.
    comm_.ClosePairs();
    std::lock_guard<std::mutex> lock(comm_.abort_mu_);
    throw gloo_internal::CollectiveAborted(comm_.abort_reason_);
  }

  GlooCommunicator& comm_;
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer_;
  const int unwinding_at_start_ = std::uncaught_exceptions();
};

// Gloo reports failures (a peer gone, a timeout, a bad argument) by throwing.
// After Abort() whatever a collective throws (an interrupted wait, a socket
// the abort closed under it) is the abort. A pair that failed (its peer
// closed, reset or left it) names its peer, in the world's ranks, as a pair
// that did not connect does: either end may be at fault, and the
// coordinator blames the link accordingly (UnreachablePeer).
template <typename Fn>
absl::Status GlooCommunicator::Guard(absl::string_view op, Fn&& fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const std::exception& e) {
    {
      std::lock_guard<std::mutex> lock(abort_mu_);
      if (aborted_) {
        return absl::AbortedError(absl::StrCat("gloo ", op, " on rank ", rank_, " of ", size_,
                                               " aborted: ", abort_reason_));
      }
    }
    const std::string failed =
        absl::StrCat("gloo ", op, " failed on rank ", rank_, " of ", size_, ": ", e.what());
    if (const std::optional<int> peer = context_->PeerNamedIn(e.what()); peer.has_value()) {
      const int world_peer = gloo_internal::WorldRank(options_, *peer);
      return WithUnreachablePeer(absl::UnavailableError(absl::StrCat(
                                     failed, " (its link to world rank ", world_peer, " failed)")),
                                 world_peer);
    }
    return absl::UnavailableError(failed);
  }
}

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_COMM_GLOO_ACTIVE_BUFFER_H_
