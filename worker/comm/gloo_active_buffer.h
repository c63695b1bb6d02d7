// GlooCommunicator's internals shared by its translation units
// (gloo_communicator.cc, gloo_ring.cc): ActiveBuffer, the registration that
// lets Abort() wake a collective's waits, and what an aborted wait throws.
// Not for use outside worker/comm.
#ifndef FLATSHARD_WORKER_COMM_GLOO_ACTIVE_BUFFER_H_
#define FLATSHARD_WORKER_COMM_GLOO_ACTIVE_BUFFER_H_

#include <algorithm>
#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include "absl/time/time.h"

#include "worker/comm/gloo_communicator.h"
#include "worker/comm/gloo_mesh_context.h"

namespace flatshard {
namespace gloo_internal {

inline std::chrono::milliseconds Millis(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
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

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_COMM_GLOO_ACTIVE_BUFFER_H_
