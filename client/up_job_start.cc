#include "client/up_job_start.h"

#include <csignal>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

#include "client/up_signals.h"

namespace flatshard {
namespace {

absl::Status Prefixed(const absl::Status& status, const std::string& what) {
  return absl::Status(status.code(), absl::StrCat(what, status.message()));
}

}  // namespace

UpJobStart StartUpJob(FlatshardClient& client, const v1::JobSpec& spec, LocalCluster& cluster,
                      UpSupervisor& supervisor, absl::Duration timeout, std::ostream& out) {
  const std::string& name = spec.name();
  const std::string says_why = absl::StrCat(" (flatshard job status -j ", name, " says why)");
  const absl::Time give_up = absl::Now() + timeout;
  const int restarts_before = supervisor.coordinator_restarts();
  int restarts_seen = restarts_before;
  bool maybe_created = false;  // a creation went unanswered: it may have landed
  bool created = false;
  bool ready = false;  // seen READY: reading the job is what is left
  absl::Status last;
  for (;;) {
    // A coordinator started again takes its job back through a recovery:
    // READY is to be seen again.
    if (supervisor.coordinator_restarts() != restarts_seen) {
      restarts_seen = supervisor.coordinator_restarts();
      ready = false;
    }
    if (!created) {
      absl::StatusOr<v1::Job> job = client.CreateJob(spec);
      const bool existed = job.status().code() == absl::StatusCode::kAlreadyExists;
      if (existed) job = client.GetJob(name);
      if (job.ok()) {
        created = true;
        out << "job '" << name
            << (existed && !maybe_created
                    ? "' is in the state dir: continuing it (delete it to start over)"
                    : "' created")
            << "; waiting for it to be READY" << std::endl;
      } else {
        last = Prefixed(job.status(), absl::StrCat("creating job '", name, "': "));
        maybe_created |= !existed && (absl::IsUnavailable(job.status()) ||
                                      absl::IsDeadlineExceeded(job.status()));
      }
    }
    if (created && !ready) {
      absl::StatusOr<v1::JobState> state = client.WaitForState(name, {v1::READY}, absl::Seconds(1));
      ready = state.ok();
      if (absl::IsDeadlineExceeded(state.status())) {
        last = absl::DeadlineExceededError(absl::StrCat("job '", name, "' is not READY after ",
                                                        absl::FormatDuration(timeout), says_why));
      } else if (!state.ok()) {
        last = Prefixed(state.status(), absl::StrCat("job '", name, "' is not READY: "));
        last = absl::Status(last.code(), absl::StrCat(last.message(), says_why));
      }
    }
    if (ready) {
      // The step now, not the state dir's: a continued job may have rolled
      // back to its last checkpoint on the way to READY.
      absl::StatusOr<v1::Job> job = client.GetJob(name);
      if (job.ok()) return {0, job};
      last = Prefixed(job.status(), absl::StrCat("job '", name, "' is READY, but reading it: "));
    }
    // Worth another try: a slice that ran out; anything while the
    // coordinator is down (its SIGCHLD decides); after it was started
    // again, what a dying or a new coordinator answers.
    const bool down = cluster.coordinator().Wait(absl::ZeroDuration()).has_value();
    const bool restarted = supervisor.coordinator_restarts() != restarts_before;
    const absl::StatusCode code = last.code();
    if (restarted && !ready && code == absl::StatusCode::kNotFound) created = false;
    const bool again = code == absl::StatusCode::kDeadlineExceeded || down ||
                       (restarted && (code == absl::StatusCode::kUnavailable ||
                                      code == absl::StatusCode::kNotFound ||
                                      code == absl::StatusCode::kCancelled));
    if (!again) return {0, last};
    // Not at once again, unless a slice's wait was the wait.
    int signal = TakeUpSignal(code == absl::StatusCode::kDeadlineExceeded && created && !ready
                                  ? absl::ZeroDuration()
                                  : absl::Seconds(1));
    if (signal == SIGCHLD && !supervisor.OnChildExit()) return {SIGCHLD, last};
    if (supervisor.interrupted()) signal = TakeStopSignal(absl::InfiniteDuration());
    if (signal != 0 && signal != SIGCHLD) return {signal, last};
    supervisor.RetryDue(absl::Now());
    if (absl::Now() >= give_up) return {0, last};
  }
}

}  // namespace flatshard
