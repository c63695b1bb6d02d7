// Collectives over NCCL for CUDA memory, enqueued on the CUDA stream they are
// issued on (the runtime's communication stream), so they overlap compute exactly
// as FSDP's unshard and post-backward streams do. Rendezvous: rank 0 puts the
// NCCL unique id in the Store (the coordinator's on a cluster); subgroups for the
// hybrid strategies come from ncclCommSplit.
//
// A dead peer must fail the step, not hang it: NCCL reports errors only
// asynchronously and a collective waiting for a peer that will never come spins
// forever. A watchdog thread polls ncclCommGetAsyncError and the completion event
// of every collective in flight; on an error, or a collective older than the
// timeout, it marks the stream failed (so Synchronize there returns the error)
// and aborts the communicator (ncclCommAbort), which ends the spinning kernels.
// After an abort every call is refused with the reason; the communicator is never
// touched again (ncclCommAbort frees it).
//
// Nor may a dead peer hang a host thread inside NCCL: an initialization waits
// for every rank to join, a split for every rank of the parent, and a
// collective's first enqueue connects to its peers. So every communicator is
// non-blocking (`blocking = 0`): those calls return at once and are waited for
// here (worker/comm/nccl_wait.h), up to the timeout, and no longer than an
// abort (NcclOptions::abort during a Configure, Abort() later).
//
// Threading: collectives are issued from one thread at a time (the runtime's);
// Abort may come from any thread. NCCL forbids using one communicator from two
// threads at once, so nothing else (background checkpoint writes) uses it.
#ifndef FLATSHARD_WORKER_COMM_NCCL_COLLECTIVES_H_
#define FLATSHARD_WORKER_COMM_NCCL_COLLECTIVES_H_

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "absl/time/time.h"

#include "worker/comm/abort_signal.h"
#include "worker/comm/collectives.h"
#include "worker/comm/nccl_wait.h"
#include "worker/comm/store.h"

namespace flatshard {

struct NcclOptions {
  int device = 0;  // CUDA ordinal of this rank
  // A collective not complete this long after it was issued fails the stream and
  // aborts the communicator; also the rendezvous timeout.
  absl::Duration timeout = absl::Seconds(60);
  absl::Duration poll_interval = absl::Milliseconds(20);  // the watchdog's
  std::string prefix = "nccl";                            // store namespace
  // The worker's Configure signal: aborting it ends an initialization or a
  // split still waiting for its peers (ABORTED), as Abort() does later.
  std::shared_ptr<AbortSignal> abort;
};

class NcclCollectives : public Collectives {
 public:
  // FAILED_PRECONDITION without a usable device.
  static absl::StatusOr<std::unique_ptr<NcclCollectives>> Create(
      const std::shared_ptr<Store>& store, int rank, int size, const NcclOptions& options);
  ~NcclCollectives() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status AllGather(Stream& stream, DeviceSpan<const std::byte> input,
                         DeviceSpan<std::byte> output, size_t count, DType dtype) override;
  absl::Status ReduceScatter(Stream& stream, DeviceSpan<const std::byte> input,
                             DeviceSpan<std::byte> output, size_t count, DType dtype) override;
  absl::Status ReduceScatterInPlace(Stream& stream, DeviceSpan<std::byte> buffer, size_t count,
                                    DType dtype) override;
  // An fp32 gradient that needs no padding is reduce-scattered straight from
  // where backward left it, its pre-divide folded into the reduction
  // (ncclRedOpCreatePreMulSum); a first gradient with a power-of-two
  // post-divide lands in the shard in the same call. Anything else (a cast,
  // padding) takes the three steps of Collectives::ReduceGradient.
  absl::Status ReduceGradient(Stream& stream, const GradientReduction& r) override;
  absl::Status AllReduce(Stream& stream, DeviceSpan<std::byte> buffer, size_t count, DType dtype,
                         ReduceOp op) override;
  absl::Status Broadcast(Stream& stream, DeviceSpan<std::byte> buffer, size_t count, DType dtype,
                         int root) override;
  void Abort(const std::string& reason) override;
  // ncclCommSplit: every rank of this group calls it at the same point with its
  // own part of one partition of the ranks (the runtime's shard or replicate
  // groups); the color is the part's first rank.
  absl::StatusOr<std::unique_ptr<Collectives>> CreateSubgroup(const std::vector<int>& ranks,
                                                              absl::string_view name) override;

 private:
  struct InFlight {
    cudaEvent_t done = nullptr;
    Stream* stream = nullptr;
    absl::Time deadline;
    std::string op;
  };

  NcclCollectives(ncclComm_t comm, int rank, int size, NcclOptions options);
  // Refuses after an abort or a failure; otherwise runs `enqueue` (the nccl
  // calls, each through Call) on the stream and hands the collective to the
  // watchdog.
  template <typename Enqueue>
  absl::Status Issue(Stream& stream, const char* op, Enqueue&& enqueue);
  // The status of one NCCL call on comm_, waited for while NCCL finishes it
  // (ncclInProgress). mu_ held.
  absl::Status Call(ncclResult_t result, const char* what) const;
  // How a call on comm_ waits: up to the timeout, or until an abort;
  // yielding, not sleeping, for `yield_for` (nccl_wait.h).
  PollingWait Waiting(absl::string_view waiting_for, absl::Duration yield_for) const;
  // Abort()'s reason, or the Configure signal's; nullopt while neither came.
  std::optional<std::string> AbortReason() const;
  void Watch();
  // Marks the streams of everything in flight failed, then aborts. mu_ held.
  void FailLocked(const absl::Status& status);

  ncclComm_t comm_;
  int rank_;
  int size_;
  NcclOptions options_;

  // Set by Abort() before it takes mu_, which a call waiting on NCCL holds.
  mutable std::mutex abort_mu_;
  std::optional<std::string> abort_reason_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<InFlight> in_flight_;
  absl::Status failure_;  // set once: an abort or an async error
  bool stopping_ = false;
  std::thread watchdog_;
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_COMM_NCCL_COLLECTIVES_H_
