// One thread that runs a stream's work in issue order: the CPU device's
// communication stream and every stream of the simulated device. Work after a
// failure is skipped (a failed collective leaves its communicator unusable, a
// failed kernel its outputs undefined), but bookkeeping tasks (event completion,
// returning memory) always run and see the stream's first error, so nobody
// waiting on the stream hangs.
#ifndef FLATSHARD_WORKER_DEVICE_HOST_STREAM_THREAD_H_
#define FLATSHARD_WORKER_DEVICE_HOST_STREAM_THREAD_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"

namespace flatshard {

class StreamThread {
 public:
  // `before_work`, if set, runs on the thread before every work item (the
  // simulated device's random delays).
  explicit StreamThread(std::function<void()> before_work = nullptr);
  ~StreamThread();  // runs everything queued, then joins
  StreamThread(const StreamThread&) = delete;
  StreamThread& operator=(const StreamThread&) = delete;

  // Queues `work`; skipped once an earlier work item failed.
  void Post(std::function<absl::Status()> work);
  // Queues `task`, which runs even after a failure and gets the first error.
  void PostAlways(std::function<void(const absl::Status&)> task);
  // PostAlways, except that when nothing is queued or running, stream order is
  // already satisfied and `task` runs at once on the calling thread. For the
  // bookkeeping that follows cheap or no work (completing an event, returning
  // memory): queueing it would wake the thread just to run it, a futex round
  // trip each, several times per unit and step.
  void RunOrPostAlways(const std::function<void(const absl::Status&)>& task);

 private:
  struct Task {
    std::function<absl::Status()> work;               // set for Post
    std::function<void(const absl::Status&)> always;  // set for PostAlways
  };
  void Run();

  std::function<void()> before_work_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  bool running_ = false;  // the thread is running a task it took off the queue
  absl::Status failure_;  // written by the thread, under mu_
  std::thread thread_;
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_DEVICE_HOST_STREAM_THREAD_H_
