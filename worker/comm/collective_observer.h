// What the data plane reports about each collective it runs: the op, its
// size and bus traffic by the nccl-tests definitions, and how long it took.
// The worker's metrics implement the observer; ObservedCommunicator feeds it.
#ifndef FLATSHARD_WORKER_COMM_COLLECTIVE_OBSERVER_H_
#define FLATSHARD_WORKER_COMM_COLLECTIVE_OBSERVER_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace flatshard {

enum class CollectiveOp : int {
  kAllGather,
  kReduceScatter,
  kAllReduce,
  kBroadcast,
  kBarrier,
  kSendRecv,
  kGather,
};
inline constexpr int kNumCollectiveOps = static_cast<int>(CollectiveOp::kGather) + 1;

// "all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier", "send_recv",
// "gather".
absl::string_view CollectiveOpName(CollectiveOp op);

struct CollectiveSample {
  CollectiveOp op = CollectiveOp::kBarrier;
  // nccl-tests' size: the gathered output of an all-gather or gather, the scattered
  // input of a reduce-scatter, the buffer of an all-reduce or broadcast.
  int64_t bytes = 0;
  // bytes × the op's bus factor (all-reduce 2(n-1)/n, all-gather and
  // reduce-scatter (n-1)/n, broadcast 1): bus bandwidth is bus bytes over
  // time, comparable across ops and group sizes.
  double bus_bytes = 0;
  double seconds = 0;
  bool ok = true;
};

class CollectiveObserver {
 public:
  virtual ~CollectiveObserver() = default;
  // Called on the thread that ran the collective.
  virtual void Record(const CollectiveSample& sample) = 0;
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_COMM_COLLECTIVE_OBSERVER_H_
