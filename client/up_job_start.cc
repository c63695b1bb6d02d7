#include "client/up_job_start.h"

#include <csignal>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

#include "client/up_signals.h"

namespace flatshard {
namespace {

constexpr absl::Duration kDyingGrace = absl::Seconds(10);

// What a coordinator that is stopping or dying may answer.
bool MayBeADyingCoordinators(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kFailedPrecondition:  // "job is FAILED", or a dying one's refusal
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
      return true;
    default:
      return false;
  }
}

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
        last = job.status();  // as it is: "no coordinator at ..." sets the exit code
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
    // again, what a dying or a new coordinator answers. Anything else is
    // an answer, once the coordinator has not exited within kDyingGrace.
    const absl::StatusCode code = last.code();
    const bool restarted = supervisor.coordinator_restarts() != restarts_before;
    const bool down = cluster.coordinator().Wait(absl::ZeroDuration()).has_value();
    if (restarted && !ready && code == absl::StatusCode::kNotFound) created = false;
    const bool again = code == absl::StatusCode::kDeadlineExceeded || down ||
                       (restarted && (code == absl::StatusCode::kUnavailable ||
                                      code == absl::StatusCode::kNotFound ||
                                      code == absl::StatusCode::kCancelled));
    int signal = 0;
    if (again) {
      // Not at once again, unless a slice's wait was the wait.
      signal = TakeUpSignal(code == absl::StatusCode::kDeadlineExceeded && created && !ready
                                ? absl::ZeroDuration()
                                : absl::Seconds(1));
    } else if (MayBeADyingCoordinators(code)) {
      // A coordinator that is stopping or dying answers (ends the watch
      // UNAVAILABLE; refuses) before it exits, which may take a while
      // (its server's shutdown grace): its exit within the grace `up` gives
      // a daemon tells that from an answer. Ctrl-C is heard meanwhile.
      signal = TakeUpSignal(kDyingGrace);
      if (signal == 0) return {0, last};
    } else {
      return {0, last};  // about the job or the request: an answer
    }
    if (signal == SIGCHLD && !supervisor.OnChildExit()) return {SIGCHLD, last};
    if (supervisor.interrupted()) signal = TakeStopSignal(absl::InfiniteDuration());
    if (signal != 0 && signal != SIGCHLD) return {signal, last};
    supervisor.RetryDue();
    if (supervisor.interrupted()) return {TakeStopSignal(absl::InfiniteDuration()), last};
    // No worker left to seat: waiting out the timeout would change nothing.
    if (supervisor.EveryWorkerGone()) return {0, last, /*workers_gone=*/true};
    if (absl::Now() >= give_up) return {0, last};
  }
}

}  // namespace flatshard
