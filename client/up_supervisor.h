// What `flatshard up` does as its daemons' supervisor when one exits
// (SIGCHLD), as systemd's Restart=on-failure does for the packaged units
// (deploy/systemd):
// - A worker that ended itself wedged (exit status 3, core/worker_exit_codes.h)
//   holds nothing any more: it is started again under its id, which it
//   proves with its seat's secret, and grows its job back at a scheduled
//   checkpoint. A worker that exited any other way stays down (a kill -9 to
//   watch a recovery), as does one whose restart failed.
// - A coordinator that failed (killed, or a non-zero exit) is started again
//   on the same address and state dir, where the workers find it, and takes
//   its job back (docs/fault-tolerance.md); at most kMaxCoordinatorRestarts
//   times within kCoordinatorRestartWindow, as systemd's StartLimitBurst.
//   One that exited 0 was stopped on purpose: the cluster ends.
#ifndef FLATSHARD_CLIENT_UP_SUPERVISOR_H_
#define FLATSHARD_CLIENT_UP_SUPERVISOR_H_

#include <deque>
#include <ostream>

#include "absl/time/time.h"

#include "client/local_cluster.h"
#include "client/local_prometheus.h"

namespace flatshard {

class UpSupervisor {
 public:
  static constexpr int kMaxCoordinatorRestarts = 3;
  static constexpr absl::Duration kCoordinatorRestartWindow = absl::Minutes(10);

  // `prometheus` may be null; it is told the restarted daemons' /metrics.
  UpSupervisor(LocalCluster& cluster, LocalPrometheus* prometheus, std::ostream& out,
               std::ostream& err)
      : cluster_(cluster), prometheus_(prometheus), out_(out), err_(err) {}

  // After a SIGCHLD: starts again what is due, saying so on `out` (and what
  // failed on `err`). False when the cluster must end: its coordinator is
  // gone for good.
  bool OnChildExit();

 private:
  bool OnCoordinatorExit(int wait_status);
  void RestartWedgedWorkers();

  LocalCluster& cluster_;
  LocalPrometheus* prometheus_;
  std::ostream& out_;
  std::ostream& err_;
  std::deque<absl::Time> coordinator_restarts_;  // within the window
};

}  // namespace flatshard

#endif  // FLATSHARD_CLIENT_UP_SUPERVISOR_H_
