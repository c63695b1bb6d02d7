// A coordinator and N workers on this machine as child processes: what
// `flatshard up` runs and what the end-to-end tests start. Start returns once
// the coordinator listens and every worker has registered (each says so on
// its stdout); destruction stops them with SIGTERM, then SIGKILL.
#ifndef FLATSHARD_CLIENT_LOCAL_CLUSTER_H_
#define FLATSHARD_CLIENT_LOCAL_CLUSTER_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "client/child_process.h"

namespace flatshard {

struct LocalClusterOptions {
  int workers = 4;
  std::string listen = "127.0.0.1:0";  // the coordinator's address
  std::string bin_dir;                 // where flatshard-coordinator and flatshard-worker are
  double heartbeat_interval_s = 1.0;
  double heartbeat_timeout_s = 5.0;
  double collective_timeout_s = 60.0;
  double coordinator_timeout_s = 10.0;  // every worker's --coordinator-timeout
  std::string data_dir = ".";
  std::string checkpoint_dir = "checkpoints";
  // The coordinator's --state-dir, and in its worker-seats/ the workers'
  // (their ids' secrets); empty: a fresh temporary directory, removed with
  // the cluster (nothing carries over to the next cluster).
  std::string state_dir;
  bool metrics = true;         // every daemon serves /metrics on a free loopback port
  std::string device = "cpu";  // every worker's --device: cpu, cuda or sim
  std::string comm = "auto";   // every worker's --comm
  // With device cuda: worker i drives gpus[i % gpus.size()]; empty: GPU i.
  std::vector<int> gpus;
  // Every CPU (and sim) worker's --compute-threads; 0: unless the environment
  // sets OPENBLAS_NUM_THREADS, each worker's share of this host's cores
  // (ComputeThreadsPerWorker), as torchrun sets OMP_NUM_THREADS for several
  // processes on a node.
  int compute_threads = 0;
  absl::Duration start_timeout = absl::Seconds(60);
  // Readable when nobody should wait for a daemon's start any more (`up`'s
  // signalfd while a Ctrl-C is pending): starts and restarts then end with
  // CANCELLED, the half-started daemon stopped. -1: none.
  int interrupt_fd = -1;
  // Worker i's --checkpoint-dir, where its node mounts the shared checkpoint
  // storage (default: checkpoint_dir, the coordinator's --checkpoint-root).
  std::map<int, std::string> worker_checkpoint_dirs;
  // More flags for worker i (tests: --inject-file-faults on one rank).
  std::map<int, std::vector<std::string>> worker_flags;
  // More flags for the coordinator and for every worker (TLS, tokens: see
  // client/cluster_security.h).
  std::vector<std::string> coordinator_flags;
  std::vector<std::string> every_worker_flags;
  // A command worker i runs under (tests: {"ip", "netns", "exec", NS} puts it
  // in a network namespace).
  std::map<int, std::vector<std::string>> worker_command_prefix;
};

// The GEMM threads each of `workers` CPU workers on one host gets by default:
// an equal share of its hardware threads, at least one. All of them each
// would have the workers' idle BLAS threads spin on the cores the others
// compute on.
int ComputeThreadsPerWorker(unsigned hardware_threads, int workers);

class LocalCluster {
 public:
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(const LocalClusterOptions& options);
  ~LocalCluster();

  const std::string& address() const { return address_; }
  // The command token every worker shares (--command-token-file): what a
  // test needs to call a worker directly, as the coordinator does.
  const std::string& command_token() const { return command_token_; }
  ChildProcess& coordinator() { return *coordinator_; }
  ChildProcess& worker(int i) { return *workers_[static_cast<size_t>(i)]; }
  int num_workers() const { return static_cast<int>(workers_.size()); }
  // "flatshard-worker w0 rank 0 listening on 127.0.0.1:41234" lines, by worker.
  const std::vector<std::string>& worker_banners() const { return banners_; }
  // host:port of each worker's WorkerService.
  const std::vector<std::string>& worker_addresses() const { return worker_addresses_; }
  // host:port of each daemon's /metrics (empty without metrics).
  const std::string& coordinator_metrics() const { return coordinator_metrics_; }
  const std::vector<std::string>& worker_metrics() const { return worker_metrics_; }

  // Stops the coordinator, then the workers; true when all exited cleanly.
  bool Stop();
  // SIGKILLs every daemon now; callable from another thread while Stop()
  // waits for them (a user's Ctrl-C that will not wait for their grace), not
  // while one restarts a daemon (which replaces it).
  void KillAll() const;
  // Whether stopping the cluster had to SIGKILL a daemon (past its grace, or
  // KillAll()); a daemon that had already exited is not counted.
  bool KilledAny() const;
  // Kills the coordinator with SIGKILL (it gets no chance to clean up) and
  // starts it again on the same address and state dir; returns once it
  // listens. The workers are left running. `while_down` runs between the two
  // (tests: what a crash at some moment would have left in the state dir).
  absl::Status KillAndRestartCoordinator(const std::function<void()>& while_down = {});
  // Starts the coordinator again, on the same address and state dir, after
  // it exited (FAILED_PRECONDITION while it runs); returns once it listens.
  // One whose start fails is stopped again.
  absl::Status RestartCoordinator();
  // Starts worker `i` again with the arguments it had (its id, so it keeps its
  // rank) after it died; returns once it has registered. It must have exited.
  // One whose start fails is stopped again. `changed` sets flags to new values
  // for this start and later ones (what its node is now: its data set gone, an
  // address the coordinator cannot reach); a flag it did not have is added.
  // The daemon is sent SIGTERM when the thread that started it ends
  // (PR_SET_PDEATHSIG follows the thread), so call it from one that lives on.
  absl::Status RestartWorker(int i, const std::map<std::string, std::string>& changed = {});
  // The workers that ended themselves wedged (exit status kWedgedExitCode,
  // core/worker_exit_codes.h) and were not started again; waits for none.
  std::vector<int> WedgedWorkers();
  // What a supervisor does for them: each is started again, under its id;
  // the indices restarted. A worker that exited any other way stays down (a
  // kill -9 shows a recovery). Every wedged worker is tried; the first
  // failure is returned, and its worker stays down.
  absl::StatusOr<std::vector<int>> RestartWedgedWorkers();

  // The directory holding this executable (for bin_dir).
  static std::string SelfDirectory();

 private:
  LocalCluster() = default;
  absl::Status StartCoordinator(const std::string& listen);
  // Reads worker `w`'s "listening on" line into its addresses and banner.
  absl::Status ReadWorkerBanner(size_t w);

  LocalClusterOptions options_;
  std::string bin_;
  std::string state_dir_;
  bool own_state_dir_ = false;  // a temporary one: removed with the cluster
  std::string address_;
  std::string command_token_;
  std::unique_ptr<ChildProcess> coordinator_;
  std::vector<std::unique_ptr<ChildProcess>> workers_;
  std::vector<std::vector<std::string>> worker_args_;
  std::vector<std::string> banners_;
  std::vector<std::string> worker_addresses_;
  std::string coordinator_metrics_;
  std::vector<std::string> worker_metrics_;
};

}  // namespace flatshard

#endif  // FLATSHARD_CLIENT_LOCAL_CLUSTER_H_
