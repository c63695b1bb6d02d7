// `flatshard train` and `flatshard job stop`: the training runs on the
// coordinator (it outlives this process); this command starts or follows it
// and streams its steps. Ctrl-C asks the coordinator to stop after the
// current step and keeps streaming until it has; a second Ctrl-C leaves the
// training running and exits. A stream cut (the coordinator went away) says
// how to follow the training again.
#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include <pthread.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

#include "client/cli_output.h"
#include "client/cluster_commands.h"
#include "client/flatshard_client.h"

namespace flatshard {
namespace {

constexpr int kExitInterrupted = 130;  // 128 + SIGINT, as shells report it

std::string WhoAmI() {
  const char* user = std::getenv("USER");
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return absl::StrCat(user != nullptr ? user : "unknown", "@", host);
}

// Takes SIGINT while training streams: the first asks the coordinator to
// stop the training, the second leaves it running and exits.
class InterruptHandler {
 public:
  InterruptHandler(CoordinatorTarget coordinator, std::string job, std::ostream& err)
      : coordinator_(std::move(coordinator)), job_(std::move(job)), err_(err) {
    sigemptyset(&signals_);
    sigaddset(&signals_, SIGINT);
    // Blocked here, before the gRPC threads exist, so they inherit the mask
    // and only the watcher takes the signal.
    pthread_sigmask(SIG_BLOCK, &signals_, &previous_);
    watcher_ = std::thread([this] { Watch(); });
  }
  ~InterruptHandler() {
    done_ = true;
    watcher_.join();
    pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
  }
  InterruptHandler(const InterruptHandler&) = delete;
  InterruptHandler& operator=(const InterruptHandler&) = delete;

 private:
  void Watch() {
    int interrupts = 0;
    const timespec tick{0, 200'000'000};
    while (!done_) {
      // A bounded wait, so the watcher notices the end of the stream.
      if (sigtimedwait(&signals_, nullptr, &tick) != SIGINT) continue;
      if (++interrupts >= 2) {
        err_ << "\nleaving the training running on the coordinator; follow it with "
             << "`flatshard train --attach -j " << job_ << "`" << std::endl;
        _exit(kExitInterrupted);
      }
      FlatshardClient client(coordinator_);
      absl::StatusOr<v1::StopTrainingResponse> stopped = client.StopTraining(job_);
      if (stopped.ok()) {
        err_ << "\nCtrl-C: the training stops after the step in flight (step "
             << stopped->step() + 1 << "); Ctrl-C again leaves it running" << std::endl;
      } else {
        err_ << "\nCtrl-C: could not stop the training: " << stopped.status().message()
             << std::endl;
      }
    }
  }

  const CoordinatorTarget coordinator_;
  const std::string job_;
  std::ostream& err_;
  sigset_t signals_;
  sigset_t previous_;
  std::atomic<bool> done_{false};
  std::thread watcher_;
};

}  // namespace

std::string TrainingSummary(const v1::TrainingOperation& t) {
  const absl::Time started = absl::UnixEpoch() + absl::Seconds(t.started_at_unix());
  std::string line =
      absl::StrCat("to step ", t.target_step(), ", started by ", t.started_by(), " at ",
                   absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", started, absl::UTCTimeZone()));
  if (t.running()) {
    absl::StrAppend(&line,
                    t.stop_requested() ? " (running, stopping after this step)" : " (running)");
  } else {
    absl::StrAppend(&line, " (", t.outcome(), ")");
  }
  return line;
}

int ClusterCommands::JobStop(std::ostream& out, std::ostream& err) {
  FlatshardClient client(coordinator_);
  absl::StatusOr<v1::StopTrainingResponse> stopped = client.StopTraining(job_);
  if (!stopped.ok()) return ReportError("job stop", stopped.status(), err);
  if (json_) {
    out << MessageToJson(*stopped) << "\n";
  } else {
    out << "job '" << job_ << "': the training stops after the step in flight (it was at step "
        << stopped->step() << ")\n";
  }
  return kExitOk;
}

int ClusterCommands::Train(std::ostream& out, std::ostream& err) {
  if (attach_ && detach_) {
    return ReportError("train",
                       absl::InvalidArgumentError("--attach and --detach exclude each other"), err);
  }
  if (!attach_ && steps_ <= 0) {
    return ReportError(
        "train",
        absl::InvalidArgumentError(
            steps_ == 0 ? "--steps is required (or --attach to follow a running training)"
                        : absl::StrCat("--steps must be positive, got ", steps_)),
        err);
  }
  v1::TrainRequest request;
  request.set_job(job_);
  request.set_steps(steps_);
  request.set_no_sync_micro_steps(micro_steps_);
  request.set_attach(attach_);
  request.set_detach(detach_);
  request.set_started_by(WhoAmI());
  std::optional<InterruptHandler> interrupts;
  if (!detach_) interrupts.emplace(coordinator_, job_, err);
  std::ofstream log;
  if (!train_log_.empty()) {
    log.open(train_log_, std::ios::app);
    if (!log) {
      return ReportError("train",
                         absl::InvalidArgumentError(
                             absl::StrCat("--log: cannot open '", train_log_, "' for appending")),
                         err);
    }
  }
  FlatshardClient client(coordinator_);
  const bool tty = !json_ && isatty(STDOUT_FILENO) != 0;
  const absl::Time start = absl::Now();
  double first_loss = 0, last_loss = 0;
  int64_t first_step = 0, last_step = 0, target = 0;
  int64_t done = 0;
  absl::Status status = client.Train(request, [&](const v1::StepResult& r) {
    if (done++ == 0) {
      first_loss = r.loss();
      first_step = r.step();
      target = r.target_step();
    }
    last_loss = r.loss();
    last_step = r.step();
    if (log.is_open()) log << MessageToJson(r) << std::endl;  // readable while it trains
    if (json_) {
      out << MessageToJson(r) << std::endl;
      return;
    }
    if (r.has_recovery()) {
      out << (tty ? "\r\033[K" : "") << "recovered: " << RecoverySummary(r.recovery()) << "\n";
    }
    const double elapsed = absl::ToDoubleSeconds(absl::Now() - start);
    const int64_t left = std::max<int64_t>(0, target - r.step());
    const double eta = elapsed / static_cast<double>(done) * static_cast<double>(left);
    // The gradient norm exists only when the job clips.
    const std::string line = absl::StrFormat(
        "step %d (%d to go)  loss %.5f%s  %.0f samples/s  %s/step  ETA %s", r.step(), left,
        r.loss(), r.grad_norm() < 0 ? "" : absl::StrFormat("  grad-norm %.4f", r.grad_norm()),
        r.samples_per_second(), FormatMillis(r.step_seconds()), FormatSeconds(eta));
    if (tty) {
      out << "\r\033[K" << line << std::flush;
    } else {
      out << line << "\n";
    }
  });
  if (tty) out << "\n";
  if (detach_ && status.ok()) {
    if (!json_) {
      out << "training of job '" << job_ << "' started on the coordinator (" << steps_
          << " steps); follow it with `flatshard train --attach -j " << job_
          << "`, stop it with `flatshard job stop -j " << job_ << "`\n";
    }
    return kExitOk;
  }
  // A job that FAILED ends the stream with its failure, which may be
  // UNAVAILABLE too (a rank that no longer answers): only a coordinator that
  // does not answer either means the stream was cut.
  const bool cut = status.code() == absl::StatusCode::kUnavailable && [&] {
    absl::StatusOr<v1::Job> job = client.GetJob(job_);
    return !job.ok() || job->state() != v1::FAILED;
  }();
  if (cut) {
    // The coordinator went away mid-stream (or never answered).
    err << "flatshard train: the stream from the coordinator at " << coordinator_.address
        << " was cut" << (done > 0 ? absl::StrCat(" after step ", last_step) : std::string())
        << ": " << status.message()
        << "\nThe training goes on wherever the coordinator is running; "
        << "once it is back (its state dir keeps the job), `flatshard train --attach -j " << job_
        << "` follows it again.\n";
    return ExitCodeFor(status);
  }
  if (!status.ok()) {
    if (done > 0 && !json_) {
      out << "stopped after " << done << " steps (at step " << last_step << ")\n";
    }
    return ReportError("train", status, err);
  }
  if (!json_) {
    out << absl::StrFormat("trained %d steps in %s: loss %.5f (step %d) -> %.5f (step %d)\n", done,
                           FormatSeconds(absl::ToDoubleSeconds(absl::Now() - start)), first_loss,
                           first_step, last_loss, last_step);
    if (last_step < target) {
      out << "stopped on request at step " << last_step << " of " << target << "\n";
    }
    out << "Next: flatshard summon -j " << job_ << " --out model.safetensors, or train more\n";
  }
  return kExitOk;
}

}  // namespace flatshard
