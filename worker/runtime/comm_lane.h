// The communication lane: one thread that runs collectives in the order they are
// submitted, so prefetched all-gathers and reduce-scatters overlap the compute
// lane (the caller's thread), as FSDP's unshard and post-backward CUDA streams do.
// Submit returns a Completion to wait on where the schedule needs the result
// (c10d's Work::wait()). Issue order is execution order on every rank, which is
// what keeps the ranks' collectives matched.
#ifndef FLATSHARD_WORKER_RUNTIME_COMM_LANE_H_
#define FLATSHARD_WORKER_RUNTIME_COMM_LANE_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/status/status.h"

namespace flatshard {

class Completion {
 public:
  // Blocks until the task ran; its status (or the lane's earlier failure).
  absl::Status Wait();
  bool done() const;

 private:
  friend class CommLane;
  void Finish(absl::Status status);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  absl::Status status_;
};

class CommLane {
 public:
  CommLane();
  ~CommLane();  // drains queued tasks, then joins
  CommLane(const CommLane&) = delete;
  CommLane& operator=(const CommLane&) = delete;

  // Queues `task`. After a task fails, later ones are not run: they complete with
  // the first failure (a communicator is unusable after an error).
  std::shared_ptr<Completion> Submit(std::function<absl::Status()> task);

  // Waits for everything submitted so far; the first failure, if any.
  absl::Status Drain();

 private:
  void Run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::function<absl::Status()>, std::shared_ptr<Completion>>> queue_;
  bool stopping_ = false;
  absl::Status failure_;
  std::shared_ptr<Completion> last_;
  std::thread thread_;
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_RUNTIME_COMM_LANE_H_
