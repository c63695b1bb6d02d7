// flatshard-worker's command line: every flag, with its default and its
// help, and what is derived from them once parsed.
#ifndef FLATSHARD_WORKER_WORKER_FLAGS_H_
#define FLATSHARD_WORKER_WORKER_FLAGS_H_

#include <cstdint>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "rpc/tls_flags.h"

namespace flatshard {

struct WorkerFlags {
  std::string coordinator;
  std::string listen = "127.0.0.1:0";
  std::string advertise_host = "127.0.0.1";
  std::string worker_id;
  std::string device = "cpu";
  int gpu = -1;  // -1: $LOCAL_RANK, else 0
  std::string comm = "auto";
  uint64_t sim_seed = 1;
  int sim_max_delay_us = 50;
  int compute_threads = 0;  // 0: OpenBLAS's own choice
  int rank = -1;
  std::string data_dir = ".";
  std::string checkpoint_dir = "./checkpoints";
  double connect_timeout_s = 30;
  double collective_timeout_s = 60;
  double abort_grace_s = 120;
  bool same_host_copies = true;
  double coordinator_timeout_s = 10;
  std::string inject_file_faults;  // tests only
  std::string state_dir = "./flatshard-worker-state";
  bool state_dir_given = false;  // with --worker-id, only a given one is used
  std::string metrics_listen;    // default: --listen's host, any port
  TlsFiles tls;
  std::string join_token;
  std::string join_token_file;
  std::string command_token_file;
  bool insecure = false;
};

// Adds every flag of flatshard-worker but --log-level to `app`, parsed into
// `flags`.
void AddWorkerFlags(CLI::App& app, WorkerFlags& flags);
// Once `app` has parsed: whether --state-dir was given, and --metrics-listen's
// default (--listen's host, any port) when it was not.
void FinishWorkerFlags(const CLI::App& app, WorkerFlags& flags);

// The first line of `path`, which `flag` names; INVALID_ARGUMENT naming both
// when it cannot be read or is empty.
absl::StatusOr<std::string> FirstLine(const char* flag, const std::string& path);
// The join token from --join-token, else the first line of --join-token-file.
absl::StatusOr<std::string> JoinToken(const WorkerFlags& f);

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_WORKER_FLAGS_H_
