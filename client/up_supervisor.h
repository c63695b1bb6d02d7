// What `flatshard up` does as its daemons' supervisor when one exits
// (SIGCHLD), as systemd's Restart=on-failure does for the packaged units
// (deploy/systemd):
// - A worker that ended itself wedged (exit status 3, core/worker_exit_codes.h)
//   holds nothing any more: it is started again under its id, which it
//   proves with its seat's secret, and grows its job back at a scheduled
//   checkpoint. A worker that exited any other way stays down (a kill -9 to
//   watch a recovery). A restart that fails (the worker exits or says
//   nothing before its start timeout) is tried again after 1 s, then 2 s,
//   4 s ... (at most 30 s), as systemd's RestartSec and RestartSteps do.
// - A coordinator that failed (killed, or a non-zero exit) is started again
//   on the same address and state dir, where the workers find it, and takes
//   its job back (docs/fault-tolerance.md). One that exited 0 was stopped on
//   purpose: the cluster ends.
// Each daemon is restarted at most kRestartBurst times within
// kRestartWindow (client/restart_limit.h), tries that failed included; past
// that a worker stays down and a coordinator ends the cluster.
#ifndef FLATSHARD_CLIENT_UP_SUPERVISOR_H_
#define FLATSHARD_CLIENT_UP_SUPERVISOR_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/time/time.h"

#include "client/local_cluster.h"
#include "client/local_prometheus.h"
#include "client/restart_limit.h"

namespace flatshard {

class UpSupervisor {
 public:
  static constexpr int kRestartBurst = 3;
  static constexpr absl::Duration kRestartWindow = absl::Minutes(10);

  // `prometheus` may be null; it is told the restarted daemons' /metrics.
  UpSupervisor(LocalCluster& cluster, LocalPrometheus* prometheus, std::ostream& out,
               std::ostream& err);

  // After a SIGCHLD: starts again what is due, saying so on `out` (and what
  // failed on `err`). False when the cluster must end: its coordinator is
  // gone for good.
  bool OnChildExit();

  // How long until a failed worker restart is next tried again;
  // InfiniteDuration() when none is due.
  absl::Duration UntilNextRetry() const;
  // Tries again the worker restarts that are due.
  void RetryDue();

  // Whether every worker has exited and none is to be started again (each
  // ended for good, or its restarts ran out): the cluster can do nothing
  // more, and a supervisor of `up` learns so from its exit.
  bool EveryWorkerGone();

  // Whether a stop signal interrupted a restart (LocalClusterOptions::
  // interrupt_fd): its daemon is left down, nothing more is restarted, and
  // the caller takes that signal (pending still) and stops.
  bool interrupted() const { return interrupted_; }
  // The coordinator's restarts that succeeded: a caller whose calls failed
  // while it was down tries them again against the new one.
  int coordinator_restarts() const { return coordinator_restarts_; }

 private:
  static constexpr absl::Duration kFirstRetryDelay = absl::Seconds(1);
  static constexpr absl::Duration kMaxRetryDelay = absl::Seconds(30);

  // The supervisor's timers (retries, restart windows) run on the
  // monotonic clock: a wall clock stepped back would hold a retry, or
  // stepped forward end a restart window, by as much.
  static absl::Time Now();

  bool OnCoordinatorExit(int wait_status);
  void OnWedgedWorker(int i);
  // Starts worker `i` again (its restart is counted); `why` begins what is
  // said about it.
  void StartWorkerAgain(int i, const std::string& why);

  LocalCluster& cluster_;
  LocalPrometheus* prometheus_;
  std::ostream& out_;
  std::ostream& err_;
  RestartLimit coordinator_limit_;
  std::vector<RestartLimit> worker_limits_;  // by worker index
  std::vector<bool> left_down_;              // said so once
  std::vector<absl::Time> retry_at_;         // on Now(); InfiniteFuture(): none due
  std::vector<int> failed_tries_;            // in a row, for the next delay
  bool interrupted_ = false;
  int coordinator_restarts_ = 0;
};

}  // namespace flatshard

#endif  // FLATSHARD_CLIENT_UP_SUPERVISOR_H_
