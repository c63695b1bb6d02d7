// Ends a worker whose aborted work does not let go. An abort fails the
// collectives in flight, so a batch blocked on a peer returns at once; work
// blocked anywhere else (a write into a hung network mount, a read of a data
// set that never answers, a device kernel that never completes) does not. It
// keeps the worker's run lock, its runtime and its memory for good: the
// daemon can serve neither the recovery of its job nor another job, yet its
// heartbeats go on, so the coordinator keeps choosing it and each try waits
// out a timeout. As PyTorch's NCCL watchdog tears down a process whose
// collectives cannot be aborted, the worker ends itself once the work has not
// returned `grace` after its abort: the coordinator sees the rank gone, and
// the daemon's supervisor (Kubernetes, systemd) starts it again clean.
#ifndef FLATSHARD_WORKER_SERVICE_ABORT_WATCHDOG_H_
#define FLATSHARD_WORKER_SERVICE_ABORT_WATCHDOG_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/time/time.h"

#include "core/worker_exit_codes.h"  // kWedgedExitCode, what the watchdog ends a worker with

namespace flatshard {

class AbortWatchdog {
 public:
  // `on_wedged` runs once, on the watchdog's thread, with what did not let
  // go (the daemon's callback ends the process). A zero `grace` disables the watchdog.
  AbortWatchdog(absl::Duration grace, std::function<void(const std::string&)> on_wedged);
  // Stops watching; calls nothing for what is still armed.
  ~AbortWatchdog();
  AbortWatchdog(const AbortWatchdog&) = delete;
  AbortWatchdog& operator=(const AbortWatchdog&) = delete;

  absl::Duration grace() const { return grace_; }
  // Starts the clock on aborted work `what` ("batch seq 7 (step) of epoch
  // 2", ...); the token for Disarm, which must come within the grace. 0 (and
  // nothing armed) when disabled.
  uint64_t Arm(std::string what);
  // The work returned; a token of 0 or one already disarmed is ignored.
  void Disarm(uint64_t token);

 private:
  void Watch();

  const absl::Duration grace_;
  const std::function<void(const std::string&)> on_wedged_;
  std::mutex mu_;
  std::condition_variable changed_;
  struct Armed {
    std::chrono::steady_clock::time_point deadline;  // immune to wall-clock steps
    std::string what;
  };
  std::map<uint64_t, Armed> armed_;  // by token
  uint64_t next_token_ = 1;
  bool stopping_ = false;
  std::thread thread_;  // last: started once the rest is built
};

// How long aborted work that started draining at `since` has drained: zero
// for none, at least a millisecond otherwise (zero on the wire means nothing
// drains).
absl::Duration DrainingFor(std::optional<std::chrono::steady_clock::time_point> since);

// The batch a worker runs, as its watchdog sees it: an abort that reaches
// it arms the watchdog once, its end disarms it, and in between it says how
// long it has been draining (GetStatus reports that to a recovery's probe,
// coordinator/drain_wait.h). Not thread-safe: the worker calls it under its
// state lock.
class WatchedBatch {
 public:
  explicit WatchedBatch(AbortWatchdog* watchdog) : watchdog_(watchdog) {}

  // `what` names the batch in the watchdog's report; `epoch` is its job's.
  void Begin(std::string what, uint64_t epoch);
  void End();
  // An abort of `epoch` or older (0: whatever runs) reached the worker. An
  // abort of an older epoch than the batch's leaves it alone.
  void Aborted(const std::string& reason, uint64_t epoch);
  // How long the batch in flight has run since its abort; zero when none
  // (or it was not aborted), at least a millisecond otherwise.
  absl::Duration Draining() const;

 private:
  AbortWatchdog* watchdog_;
  std::string what_;  // "" when no batch runs
  uint64_t epoch_ = 0;
  uint64_t token_ = 0;  // the watchdog's, once armed (0: not, or no watchdog)
  // When an abort reached it: steady, as the watchdog counts the grace.
  std::optional<std::chrono::steady_clock::time_point> aborted_;
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_SERVICE_ABORT_WATCHDOG_H_
