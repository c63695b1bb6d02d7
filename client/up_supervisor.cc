#include "client/up_supervisor.h"

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <sys/wait.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

#include "core/worker_exit_codes.h"

namespace flatshard {
namespace {

std::string DescribeExit(int wait_status) {
  if (WIFSIGNALED(wait_status)) {
    return absl::StrCat("killed by signal ", WTERMSIG(wait_status), ", ",
                        strsignal(WTERMSIG(wait_status)));
  }
  if (WIFEXITED(wait_status)) return absl::StrCat("exit status ", WEXITSTATUS(wait_status));
  return absl::StrCat("wait status ", wait_status);
}

}  // namespace

bool UpSupervisor::OnChildExit() {
  if (const std::optional<int> gone = cluster_.coordinator().Wait(absl::ZeroDuration())) {
    if (!OnCoordinatorExit(*gone)) return false;
  }
  RestartWedgedWorkers();
  return true;
}

bool UpSupervisor::OnCoordinatorExit(int wait_status) {
  if (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) {
    err_ << "up: the coordinator exited (exit status 0: stopped on purpose); stopping the cluster"
         << std::endl;
    return false;
  }
  const absl::Time now = absl::Now();
  while (!coordinator_restarts_.empty() &&
         now - coordinator_restarts_.front() > kCoordinatorRestartWindow) {
    coordinator_restarts_.pop_front();
  }
  if (static_cast<int>(coordinator_restarts_.size()) >= kMaxCoordinatorRestarts) {
    err_ << "up: the coordinator failed (" << DescribeExit(wait_status) << ") after "
         << kMaxCoordinatorRestarts << " restarts within "
         << absl::FormatDuration(kCoordinatorRestartWindow) << "; stopping the cluster"
         << std::endl;
    return false;
  }
  coordinator_restarts_.push_back(now);
  out_ << "the coordinator failed (" << DescribeExit(wait_status) << "); starting it again on "
       << cluster_.address() << " (restart " << coordinator_restarts_.size() << " of at most "
       << kMaxCoordinatorRestarts << " within " << absl::FormatDuration(kCoordinatorRestartWindow)
       << ")" << std::endl;
  if (absl::Status restarted = cluster_.RestartCoordinator(); !restarted.ok()) {
    err_ << "up: starting the coordinator again: " << restarted.message()
         << "; stopping the cluster" << std::endl;
    return false;
  }
  out_ << "coordinator: back on " << cluster_.address()
       << "; it takes its job back from the state dir (flatshard job status says how)" << std::endl;
  if (prometheus_ != nullptr) {
    if (absl::Status target = prometheus_->SetCoordinatorTarget(cluster_.coordinator_metrics());
        !target.ok()) {
      err_ << "up --prometheus: " << target.message() << std::endl;
    }
  }
  return true;
}

void UpSupervisor::RestartWedgedWorkers() {
  const std::vector<int> wedged = cluster_.WedgedWorkers();
  if (wedged.empty()) return;
  absl::StatusOr<std::vector<int>> restarted = cluster_.RestartWedgedWorkers();
  if (!restarted.ok()) {
    err_ << "up: restarting a wedged worker: " << restarted.status().message() << " (it stays down)"
         << std::endl;
  }
  for (int i : wedged) {
    if (cluster_.worker(i).Wait(absl::ZeroDuration()).has_value()) continue;  // not restarted
    out_ << "worker-" << i << " ended itself wedged (exit status " << kWedgedExitCode
         << "); started it again" << std::endl;
  }
  if (prometheus_ != nullptr) {
    if (absl::Status targets = prometheus_->SetWorkerTargets(cluster_.worker_metrics());
        !targets.ok()) {
      err_ << "up --prometheus: " << targets.message() << std::endl;
    }
  }
}

}  // namespace flatshard
