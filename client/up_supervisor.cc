#include "client/up_supervisor.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include <sys/wait.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

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

// "3 restarts within 10m"
std::string Limit(const RestartLimit& limit) {
  return absl::StrCat(limit.burst(), " restarts within ", absl::FormatDuration(limit.window()));
}

// "restart 1 of the 3 allowed within 10m"
std::string Counted(const RestartLimit& limit) {
  return absl::StrCat("restart ", limit.count(), " of the ", limit.burst(), " allowed within ",
                      absl::FormatDuration(limit.window()));
}

// One line in one piece: stderr is unbuffered, and the daemons' own log
// lines, on the same terminal, would otherwise land inside it.
void Say(std::ostream& to, const std::string& line) { to << (line + "\n") << std::flush; }

}  // namespace

UpSupervisor::UpSupervisor(LocalCluster& cluster, LocalPrometheus* prometheus, std::ostream& out,
                           std::ostream& err)
    : cluster_(cluster),
      prometheus_(prometheus),
      out_(out),
      err_(err),
      coordinator_limit_(kRestartBurst, kRestartWindow),
      worker_limits_(static_cast<size_t>(cluster.num_workers()),
                     RestartLimit(kRestartBurst, kRestartWindow)),
      left_down_(static_cast<size_t>(cluster.num_workers()), false),
      retry_at_(static_cast<size_t>(cluster.num_workers()), absl::InfiniteFuture()),
      failed_tries_(static_cast<size_t>(cluster.num_workers()), 0) {}

bool UpSupervisor::OnChildExit() {
  if (interrupted_) return true;
  // The coordinator first: a restarted worker registers with it.
  if (const std::optional<int> gone = cluster_.coordinator().Wait(absl::ZeroDuration())) {
    if (!OnCoordinatorExit(*gone)) return false;
  }
  for (int i : cluster_.WedgedWorkers()) {
    if (interrupted_) break;  // each more would start only to be stopped
    OnWedgedWorker(i);
  }
  return true;
}

bool UpSupervisor::OnCoordinatorExit(int wait_status) {
  if (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) {
    Say(err_,
        "up: the coordinator exited (exit status 0: stopped on purpose); stopping the cluster");
    return false;
  }
  if (!coordinator_limit_.Allow(Now())) {
    Say(err_, absl::StrCat("up: the coordinator failed (", DescribeExit(wait_status), ") after ",
                           Limit(coordinator_limit_), "; stopping the cluster"));
    return false;
  }
  Say(out_, absl::StrCat("the coordinator failed (", DescribeExit(wait_status),
                         "); starting it again on ", cluster_.address(), " (",
                         Counted(coordinator_limit_), ")"));
  if (absl::Status restarted = cluster_.RestartCoordinator(); !restarted.ok()) {
    if (absl::IsCancelled(restarted)) {
      Say(err_, absl::StrCat("up: starting the coordinator again: ", restarted.message()));
      interrupted_ = true;
      return true;
    }
    Say(err_, absl::StrCat("up: starting the coordinator again: ", restarted.message(),
                           "; stopping the cluster"));
    return false;
  }
  ++coordinator_restarts_;
  Say(out_, absl::StrCat("coordinator: back on ", cluster_.address(),
                         cluster_.coordinator_metrics().empty()
                             ? std::string()
                             : absl::StrCat(", metrics on ", cluster_.coordinator_metrics()),
                         "; it takes its job back from the state dir (flatshard job status says "
                         "how)"));
  if (prometheus_ != nullptr) {
    if (absl::Status target = prometheus_->SetCoordinatorTarget(cluster_.coordinator_metrics());
        !target.ok()) {
      Say(err_, absl::StrCat("up --prometheus: ", target.message()));
    }
  }
  return true;
}

bool UpSupervisor::EveryWorkerGone() {
  for (int i = 0; i < cluster_.num_workers(); ++i) {
    const auto w = static_cast<size_t>(i);
    if (left_down_[w]) continue;
    if (retry_at_[w] != absl::InfiniteFuture()) return false;
    const std::optional<int> status = cluster_.worker(i).Wait(absl::ZeroDuration());
    if (!status.has_value()) return false;
    // Wedged since OnChildExit looked: its SIGCHLD, pending, restarts it.
    if (WIFEXITED(*status) && WEXITSTATUS(*status) == kWedgedExitCode) return false;
  }
  return cluster_.num_workers() > 0;
}

void UpSupervisor::OnWedgedWorker(int i) {
  const auto w = static_cast<size_t>(i);
  // A worker whose restart is to be tried again is handled then.
  if (left_down_[w] || retry_at_[w] != absl::InfiniteFuture()) return;
  if (!worker_limits_[w].Allow(Now())) {
    Say(err_, absl::StrCat("up: worker-", i, " ended itself wedged again, after ",
                           Limit(worker_limits_[w]), "; it stays down"));
    left_down_[w] = true;
    return;
  }
  StartWorkerAgain(
      i, absl::StrCat("worker-", i, " ended itself wedged (exit status ", kWedgedExitCode, ")"));
}

absl::Time UpSupervisor::Now() {
  return absl::UnixEpoch() + absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
}

absl::Duration UpSupervisor::UntilNextRetry() const {
  if (retry_at_.empty()) return absl::InfiniteDuration();
  // InfiniteFuture() - Now() is InfiniteDuration().
  return *std::min_element(retry_at_.begin(), retry_at_.end()) - Now();
}

void UpSupervisor::RetryDue() {
  for (int i = 0; i < cluster_.num_workers() && !interrupted_; ++i) {
    const auto w = static_cast<size_t>(i);
    // Now, for each: a restart before may have taken a while.
    const absl::Time now = Now();
    if (retry_at_[w] > now) continue;
    retry_at_[w] = absl::InfiniteFuture();
    if (!worker_limits_[w].Allow(now)) {
      Say(err_, absl::StrCat("up: worker-", i, " could not be started again, after ",
                             Limit(worker_limits_[w]), "; it stays down"));
      left_down_[w] = true;
      continue;
    }
    StartWorkerAgain(i, absl::StrCat("worker-", i, " (another try)"));
  }
}

void UpSupervisor::StartWorkerAgain(int i, const std::string& why) {
  const auto w = static_cast<size_t>(i);
  if (absl::Status restarted = cluster_.RestartWorker(i); !restarted.ok()) {
    if (absl::IsCancelled(restarted)) {
      Say(err_, absl::StrCat("up: ", why, "; starting it again: ", restarted.message(),
                             " (it stays down)"));
      left_down_[w] = true;
      interrupted_ = true;
      return;
    }
    // Another try, later: what failed may pass (a port, a file, memory).
    const absl::Duration delay =
        std::min(kFirstRetryDelay * (int64_t{1} << std::min(failed_tries_[w], 5)), kMaxRetryDelay);
    ++failed_tries_[w];
    const std::string failed = absl::StrCat("up: ", why, "; starting it again failed (",
                                            Counted(worker_limits_[w]), "): ", restarted.message());
    if (!worker_limits_[w].WouldAllow(Now() + delay)) {
      Say(err_, absl::StrCat(failed, "; it stays down"));
      left_down_[w] = true;
      return;
    }
    retry_at_[w] = Now() + delay;
    Say(err_, absl::StrCat(failed, "; trying again in ", absl::FormatDuration(delay)));
    return;
  }
  failed_tries_[w] = 0;
  Say(out_, absl::StrCat(why, "; started it again (", Counted(worker_limits_[w]), ")"));
  if (prometheus_ != nullptr) {
    if (absl::Status targets = prometheus_->SetWorkerTargets(cluster_.worker_metrics());
        !targets.ok()) {
      Say(err_, absl::StrCat("up --prometheus: ", targets.message()));
    }
  }
}

}  // namespace flatshard
