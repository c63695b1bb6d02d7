// GlooCommunicator's handshake at the end of Create, and what closes the
// pairs of a communicator whose handshake did not finish: until every peer
// has accepted its end of every pair, no pair may be reset
// (GlooCommunicator::ConfirmMesh, GlooPairListens).
#include <algorithm>
#include <memory>
#include <mutex>

#include <gloo/transport/pair.h>
#include <gloo/transport/unbound_buffer.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

#include "worker/comm/gloo_active_buffer.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/gloo_mesh_context.h"

namespace flatshard {

using gloo_internal::Millis;

GlooCommunicator::~GlooCommunicator() {
  abort_watch_.reset();  // no Abort runs from here on
  bool confirmed = false;
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    confirmed = confirmed_;
  }
  if (confirmed) return;
  // Destroying a pair closes its socket as an exiting process does, without
  // a reset, under the pair's lock and after Gloo's transport thread is past
  // it: then nothing writes into the handshake's buffers any more.
  for (int peer = 0; peer < size_; ++peer) {
    if (peer != rank_) context_->getPair(peer).reset();
  }
}

absl::Status GlooCommunicator::ConfirmMesh() {
  if (size_ == 1) {
    std::lock_guard<std::mutex> lock(abort_mu_);
    confirmed_ = true;
    return absl::OkStatus();
  }
  handshake_in_.assign(static_cast<size_t>(size_), 0);
  handshake_recv_ = context_->createUnboundBuffer(handshake_in_.data(), handshake_in_.size());
  handshake_send_ = context_->createUnboundBuffer(&handshake_out_, 1);
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    active_.push_back(handshake_recv_.get());
    active_.push_back(handshake_send_.get());
  }
  absl::Status status = Guard("handshake", [&] {
    {
      std::lock_guard<std::mutex> lock(abort_mu_);
      if (aborted_) throw gloo_internal::CollectiveAborted(abort_reason_);
    }
    const auto slot = static_cast<uint64_t>(context_->nextSlot());
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      handshake_recv_->recv(peer, slot, static_cast<size_t>(peer), 1);
      handshake_send_->send(peer, slot, 0, 1);
    }
    // One deadline for all: each wait takes what is left of it.
    const absl::Time deadline = absl::Now() + options_.timeout;
    const auto left = [&] {
      return Millis(std::max(deadline - absl::Now(), absl::ZeroDuration()));
    };
    for (int i = 1; i < size_; ++i) {
      if (!handshake_recv_->waitRecv(left())) throw gloo_internal::CollectiveAborted("woken");
    }
    for (int i = 1; i < size_; ++i) {
      if (!handshake_send_->waitSend(left())) throw gloo_internal::CollectiveAborted("woken");
    }
  });
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    std::erase(active_, handshake_recv_.get());
    std::erase(active_, handshake_send_.get());
    if (!status.ok()) return status;  // the buffers stay: the pairs may still write into them
    if (aborted_) {
      return absl::AbortedError(absl::StrCat("gloo handshake on rank ", rank_, " of ", size_,
                                             " aborted: ", abort_reason_));
    }
    confirmed_ = true;
  }
  // Every send and receive completed: no pair refers to the buffers now.
  handshake_recv_.reset();
  handshake_send_.reset();
  return absl::OkStatus();
}

}  // namespace flatshard
