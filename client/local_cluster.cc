#include "client/local_cluster.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <map>
#include <thread>

#include <sys/wait.h>
#include <unistd.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "rpc/secrets.h"

#include "client/cluster_security.h"
#include "core/status_macros.h"
#include "core/worker_exit_codes.h"
#include "storage/durable_file.h"

namespace flatshard {
namespace {

constexpr absl::string_view kCoordinatorBanner = "flatshard-coordinator listening on ";
constexpr absl::string_view kCoordinatorMetrics = "flatshard-coordinator metrics on ";
constexpr char kWorkerListening[] = " listening on ";
constexpr char kWorkerMetrics[] = ", metrics on ";

std::string Number(double v) { return absl::StrCat(v); }

// How long a daemon whose (re)start failed gets to exit on SIGTERM: none
// when a Ctrl-C ended the wait (the user will not wait more; a daemon
// survives a kill -9 by design), else the usual grace.
absl::Duration GraceAfterFailedStart(const absl::Status& failure) {
  return absl::IsCancelled(failure) ? absl::ZeroDuration() : absl::Seconds(10);
}

}  // namespace

std::string LocalCluster::SelfDirectory() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : self.parent_path().string();
}

int ComputeThreadsPerWorker(unsigned hardware_threads, int workers) {
  if (workers < 1) return 1;
  return std::max(1, static_cast<int>(hardware_threads) / workers);
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(
    const LocalClusterOptions& options) {
  if (options.workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--workers must be at least 1, got ", options.workers));
  }
  if (options.compute_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--compute-threads must be 0 (automatic) or more, got ", options.compute_threads));
  }
  const std::string bin = options.bin_dir.empty() ? SelfDirectory() : options.bin_dir;
  const std::string metrics_listen = options.metrics ? "127.0.0.1:0" : "";
  std::unique_ptr<LocalCluster> cluster(new LocalCluster());
  cluster->options_ = options;
  cluster->bin_ = bin;
  cluster->state_dir_ = options.state_dir;
  if (options.state_dir.empty()) {
    std::string pattern = (std::filesystem::temp_directory_path() / "flatshard-state-XXXXXX");
    if (mkdtemp(pattern.data()) == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("cannot create a temporary state dir: ", strerror(errno)));
    }
    cluster->state_dir_ = pattern;
    cluster->own_state_dir_ = true;
  }
  // A start a Ctrl-C ended kills what started (it holds nothing yet, and
  // the daemons survive a kill -9 by design) rather than give each its
  // grace while the user waits, with signals blocked.
  const auto killed_if_cancelled = [&cluster](absl::Status status) {
    if (absl::IsCancelled(status)) cluster->KillAll();
    return status;
  };
  RETURN_IF_ERROR(killed_if_cancelled(cluster->StartCoordinator(options.listen)));
  cluster->command_token_ = RandomSecret();
  const std::string command_token_file = cluster->state_dir_ + "/command.token";
  RETURN_IF_ERROR(WriteFileDurably(command_token_file, cluster->command_token_ + "\n", 0600));
  std::error_code ec;
  std::filesystem::create_directories(options.checkpoint_dir, ec);
  int compute_threads = options.compute_threads;
  if (compute_threads == 0 && std::getenv("OPENBLAS_NUM_THREADS") == nullptr) {
    compute_threads = ComputeThreadsPerWorker(std::thread::hardware_concurrency(), options.workers);
  }
  for (int i = 0; i < options.workers; ++i) {
    std::vector<std::string> args = {
        bin + "/flatshard-worker", "--coordinator", cluster->address_, "--worker-id",
        absl::StrCat("worker-", i),
        // The id's secret, kept beside the
        // coordinator's state: a worker started
        // again (a wedged one, or the next `up`
        // on this state dir) proves it is the
        // same one and is registered at once.
        "--state-dir", cluster->state_dir_ + "/worker-seats", "--rank", absl::StrCat(i),
        "--data-dir", options.data_dir, "--checkpoint-dir",
        options.worker_checkpoint_dirs.contains(i) ? options.worker_checkpoint_dirs.at(i)
                                                   : options.checkpoint_dir,
        "--collective-timeout", Number(options.collective_timeout_s), "--coordinator-timeout",
        Number(options.coordinator_timeout_s), "--metrics-listen", metrics_listen, "--device",
        options.device, "--comm", options.comm, "--command-token-file", command_token_file};
    if (options.device == "cuda") {
      const int gpu =
          options.gpus.empty() ? i : options.gpus[static_cast<size_t>(i) % options.gpus.size()];
      args.insert(args.end(), {"--gpu", absl::StrCat(gpu)});
    }
    if (options.device == "sim") args.insert(args.end(), {"--sim-seed", absl::StrCat(i + 1)});
    if (options.device != "cuda" && compute_threads > 0) {
      args.insert(args.end(), {"--compute-threads", absl::StrCat(compute_threads)});
    }
    args.insert(args.end(), options.every_worker_flags.begin(), options.every_worker_flags.end());
    if (auto extra = options.worker_flags.find(i); extra != options.worker_flags.end()) {
      args.insert(args.end(), extra->second.begin(), extra->second.end());
    }
    if (auto prefix = options.worker_command_prefix.find(i);
        prefix != options.worker_command_prefix.end()) {
      args.insert(args.begin(), prefix->second.begin(), prefix->second.end());
    }
    ASSIGN_OR_RETURN(std::unique_ptr<ChildProcess> worker, ChildProcess::Spawn(args));
    cluster->workers_.push_back(std::move(worker));
    cluster->worker_args_.push_back(args);
  }
  cluster->worker_addresses_.resize(cluster->workers_.size());
  if (options.metrics) cluster->worker_metrics_.resize(cluster->workers_.size());
  cluster->banners_.resize(cluster->workers_.size());
  for (size_t w = 0; w < cluster->workers_.size(); ++w) {
    RETURN_IF_ERROR(killed_if_cancelled(cluster->ReadWorkerBanner(w)));
  }
  return cluster;
}

absl::Status LocalCluster::StartCoordinator(const std::string& listen) {
  const LocalClusterOptions& options = options_;
  const std::string& state_dir = state_dir_;
  std::vector<std::string> args = {bin_ + "/flatshard-coordinator",
                                   "--listen",
                                   listen,
                                   "--heartbeat-interval",
                                   Number(options.heartbeat_interval_s),
                                   "--heartbeat-timeout",
                                   Number(options.heartbeat_timeout_s),
                                   "--checkpoint-root",
                                   options.checkpoint_dir,
                                   "--state-dir",
                                   state_dir,
                                   "--metrics-listen",
                                   options.metrics ? "127.0.0.1:0" : ""};
  args.insert(args.end(), options.coordinator_flags.begin(), options.coordinator_flags.end());
  ASSIGN_OR_RETURN(coordinator_, ChildProcess::Spawn(args));
  ASSIGN_OR_RETURN(std::string banner,
                   coordinator_->ReadLine(options.start_timeout, options.interrupt_fd));
  if (!absl::StartsWith(banner, kCoordinatorBanner)) {
    return absl::InternalError(
        absl::StrCat("flatshard-coordinator said '", banner, "' instead of its address"));
  }
  address_ = banner.substr(kCoordinatorBanner.size());
  if (options.metrics) {
    ASSIGN_OR_RETURN(std::string line,
                     coordinator_->ReadLine(options.start_timeout, options.interrupt_fd));
    if (!absl::StartsWith(line, kCoordinatorMetrics)) {
      return absl::InternalError(
          absl::StrCat("flatshard-coordinator said '", line, "' instead of its metrics address"));
    }
    coordinator_metrics_ = line.substr(kCoordinatorMetrics.size());
  }
  return absl::OkStatus();
}

absl::Status LocalCluster::KillAndRestartCoordinator(const std::function<void()>& while_down) {
  coordinator_->Signal(SIGKILL);
  (void)coordinator_->Terminate(absl::Seconds(10));  // reaps it
  if (while_down) while_down();
  return StartCoordinator(address_);
}

absl::Status LocalCluster::RestartCoordinator() {
  if (!coordinator_->Wait(absl::ZeroDuration()).has_value()) {
    return absl::FailedPreconditionError("flatshard-coordinator is still running");
  }
  absl::Status started = StartCoordinator(address_);
  // As a worker's (RestartWorker): not left running unknown.
  if (!started.ok()) (void)coordinator_->Terminate(GraceAfterFailedStart(started));
  return started;
}

absl::Status LocalCluster::ReadWorkerBanner(size_t w) {
  ChildProcess& worker = *workers_[w];
  ASSIGN_OR_RETURN(std::string line,
                   worker.ReadLine(options_.start_timeout, options_.interrupt_fd));
  // "flatshard-worker ID rank R listening on ADDR[, metrics on ADDR]"
  const std::vector<std::string> parts =
      absl::StrSplit(line, absl::MaxSplits(absl::ByString(kWorkerMetrics), 1));
  const size_t listening = parts[0].find(kWorkerListening);
  if (listening == std::string::npos || (options_.metrics && parts.size() != 2)) {
    return absl::InternalError(
        absl::StrCat(worker.name(), " said '", line, "' instead of its addresses"));
  }
  worker_addresses_[w] = parts[0].substr(listening + strlen(kWorkerListening));
  if (options_.metrics) worker_metrics_[w] = parts[1];
  banners_[w] = std::move(line);
  return absl::OkStatus();
}

absl::Status LocalCluster::RestartWorker(int i, const std::map<std::string, std::string>& changed) {
  const auto w = static_cast<size_t>(i);
  if (w >= workers_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("no worker ", i));
  }
  if (!workers_[w]->Wait(absl::ZeroDuration()).has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(workers_[w]->name(), " is still running"));
  }
  std::vector<std::string>& args = worker_args_[w];
  for (const auto& [flag, value] : changed) {
    // The daemon refuses a flag given twice, so a value it had is replaced.
    auto at = std::find(args.begin(), args.end(), flag);
    if (at != args.end() && std::next(at) != args.end()) {
      *std::next(at) = value;
    } else {
      args.insert(args.end(), {flag, value});
    }
  }
  ASSIGN_OR_RETURN(workers_[w], ChildProcess::Spawn(args));
  // Its addresses are new (port 0): its WorkerService, and its /metrics for
  // Prometheus's targets.
  absl::Status banner = ReadWorkerBanner(w);
  // One that did not say where it listens is not left running unknown: a
  // worker whose restart failed is down.
  if (!banner.ok()) (void)workers_[w]->Terminate(GraceAfterFailedStart(banner));
  return banner;
}

std::vector<int> LocalCluster::WedgedWorkers() {
  std::vector<int> wedged;
  for (int i = 0; i < num_workers(); ++i) {
    const std::optional<int> status = worker(i).Wait(absl::ZeroDuration());
    if (status.has_value() && WIFEXITED(*status) && WEXITSTATUS(*status) == kWedgedExitCode) {
      wedged.push_back(i);
    }
  }
  return wedged;
}

absl::StatusOr<std::vector<int>> LocalCluster::RestartWedgedWorkers() {
  std::vector<int> wedged = WedgedWorkers();
  // No wait first: each proves its id with the secret in its seat, so the
  // coordinator hands it the registration the exited daemon still holds.
  // Every one is tried; a worker whose restart fails stays down.
  absl::Status failed;
  std::vector<int> restarted;
  for (int i : wedged) {
    if (absl::Status s = RestartWorker(i); !s.ok()) {
      if (failed.ok()) failed = s;
      continue;
    }
    restarted.push_back(i);
  }
  if (!failed.ok()) return failed;
  return restarted;
}

bool LocalCluster::Stop() {
  bool clean = true;
  // The coordinator first: it stops its job's operations without recording
  // a failure, so its state dir keeps the job as it was. Workers stopped
  // first would fail the batches in flight (a worker's SIGTERM aborts its
  // job), and the coordinator, still running, would start a recovery and
  // persist it: a restart spent, a shrunk or FAILED job for the next start.
  if (coordinator_ != nullptr) {
    const int status = coordinator_->Terminate(absl::Seconds(10));
    clean &= WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  for (auto& worker : workers_) {
    worker->Signal(SIGTERM);
    worker->Signal(SIGCONT);  // a stopped daemon acts on it (ChildProcess::Terminate)
  }
  // One grace for them all: stopped or hung daemons cost 10 s, not 10 s each.
  const absl::Time killed_after = absl::Now() + absl::Seconds(10);
  for (auto& worker : workers_) {
    const int status =
        worker->Terminate(std::max(killed_after - absl::Now(), absl::ZeroDuration()));
    clean &= WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return clean;
}

void LocalCluster::KillAll() const {
  if (coordinator_ != nullptr) coordinator_->Kill();
  for (const auto& worker : workers_) worker->Kill();
}

bool LocalCluster::KilledAny() const {
  if (coordinator_ != nullptr && coordinator_->killed()) return true;
  for (const auto& worker : workers_) {
    if (worker->killed()) return true;
  }
  return false;
}

LocalCluster::~LocalCluster() {
  Stop();
  if (own_state_dir_) {
    std::error_code ec;
    std::filesystem::remove_all(state_dir_, ec);
  }
}

}  // namespace flatshard
