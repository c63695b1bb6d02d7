#include "worker/worker_flags.h"

#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "metrics/metrics_server.h"
#include "rpc/host_port.h"

namespace flatshard {

void AddWorkerFlags(CLI::App& app, WorkerFlags& f) {
  app.add_option("--coordinator,-c", f.coordinator,
                 "Coordinator address host:port (env FLATSHARD_COORDINATOR)")
      ->envname("FLATSHARD_COORDINATOR")
      ->required();
  app.add_option("--listen", f.listen, "Address WorkerService listens on (port 0: any free one)")
      ->capture_default_str();
  app.add_option("--advertise-host", f.advertise_host,
                 "Host the coordinator and peers reach this worker at (also Gloo's; an IPv6 "
                 "address bare or in brackets)")
      ->capture_default_str();
  app.add_option("--worker-id", f.worker_id,
                 "Stable id; a restarted daemon with the same id keeps its rank (default: the id "
                 "of the seat it claims in --state-dir)");
  app.add_option(
         "--state-dir", f.state_dir,
         "Where worker ids and their identity secrets are kept, one per seat (GPU N, the lowest "
         "free CPU slot, or the --worker-id given), so a restarted daemon comes back as itself "
         "at once. Empty: HOST-PID. With --worker-id, used only when given")
      ->capture_default_str();
  app.add_option("--inject-file-faults", f.inject_file_faults,
                 "Fault-injection tests only: make checkpoint writes fail, e.g. "
                 "disk-full:NAME[:BYTES], sync-error:NAME, crash:NAME[:BYTES], hang:NAME[:BYTES], "
                 "or make them slow, slow:NAME:MS (each write MS longer), for files whose path "
                 "contains NAME (comma-separated)");
  app.add_option("--coordinator-timeout", f.coordinator_timeout_s,
                 "Seconds without an answer from the coordinator after which a batch in flight "
                 "is aborted (a restarted coordinator then rolls back instead of waiting)")
      ->capture_default_str();
  app.add_option("--device", f.device,
                 "Device to compute on: cpu, cuda (a GPU, NCCL collectives) or sim (the strict "
                 "simulated GPU the tests use)")
      ->capture_default_str();
  app.add_option("--gpu", f.gpu,
                 "With --device cuda: the GPU index among the visible ones (respects "
                 "CUDA_VISIBLE_DEVICES; default: $LOCAL_RANK, else 0)")
      ->check(CLI::Range(0, 4095));
  app.add_option("--compute-threads", f.compute_threads,
                 "Threads for the CPU device's GEMMs (OpenBLAS). 0: OPENBLAS_NUM_THREADS, else one "
                 "per core; with several CPU workers on a host give each its share of the cores "
                 "(`flatshard up` does)")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  app.add_option("--comm", f.comm,
                 "Collectives for device memory: auto (nccl on cuda, gloo otherwise), gloo "
                 "(on cuda: staged through pinned host memory; several ranks may share a GPU) or "
                 "nccl")
      ->capture_default_str();
  app.add_option("--sim-seed", f.sim_seed, "With --device sim: seed of the random delays")
      ->capture_default_str();
  app.add_option("--sim-max-delay-us", f.sim_max_delay_us,
                 "With --device sim: each operation waits up to this many microseconds first")
      ->capture_default_str();
  app.add_option("--rank", f.rank, "Rank to ask for (-1: the coordinator assigns one)")
      ->capture_default_str();
  app.add_option("--data-dir", f.data_dir, "Root of FILE data sets")->capture_default_str();
  app.add_option("--checkpoint-dir", f.checkpoint_dir, "Root of this worker's checkpoint files")
      ->capture_default_str();
  app.add_option("--metrics-listen", f.metrics_listen,
                 "Address of the Prometheus /metrics endpoint (default: the --listen host, any "
                 "free port; printed "
                 "at start and registered with the coordinator; empty: no metrics)");
  app.add_option("--connect-timeout", f.connect_timeout_s,
                 "Seconds to wait for the coordinator at start")
      ->capture_default_str();
  app.add_option("--collective-timeout", f.collective_timeout_s,
                 "Seconds a collective may wait for a peer before failing")
      ->capture_default_str();
  app.add_option("--abort-grace", f.abort_grace_s,
                 "Seconds a batch, or an async save's background write, may go on "
                 "after it was aborted (a job failure, a re-formation) before the worker counts "
                 "itself wedged (blocked "
                 "where an abort cannot reach: a hung mount, a kernel that never ends) and "
                 "exits with status 3, for its supervisor to restart it; longer than "
                 "--collective-timeout; 0: never")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0));
  app.add_flag("--same-host-copies,!--no-same-host-copies", f.same_host_copies,
               "CPU workers of one host read each other's collective buffers directly "
               "(process_vm_readv) instead of over loopback TCP; used only when every worker of "
               "the job can and none turned it off (same host and PID namespace, ptrace "
               "allowed; never with --device cuda), logged either way")
      ->capture_default_str();
  AddTlsFlags(app, f.tls, "the coordinator");
  app.add_option("--join-token", f.join_token,
                 "Token with role worker from the coordinator's --tokens-file, proof that this "
                 "worker may join (env FLATSHARD_JOIN_TOKEN; not needed with a worker "
                 "certificate under mutual TLS)")
      ->envname("FLATSHARD_JOIN_TOKEN");
  app.add_option("--join-token-file", f.join_token_file,
                 "File whose first line is the join token (keeps it out of `ps`)");
  app.add_option("--command-token-file", f.command_token_file,
                 "File whose first line is the command token WorkerService calls must carry "
                 "(default: a fresh random one, sent only to the coordinator)");
  app.add_flag("--insecure", f.insecure,
               "Serve WorkerService without TLS on an address other hosts can reach (a "
               "trusted private network only; warns at every start)");
}

void FinishWorkerFlags(const CLI::App& app, WorkerFlags& f) {
  f.state_dir_given = app.get_option("--state-dir")->count() > 0;
  // One spelling of an IPv6 host: "[::1]" and "::1" name the same worker
  // (its id, its registered host); addresses add the brackets back.
  f.advertise_host = BareHost(f.advertise_host);
  if (app.get_option("--metrics-listen")->count() == 0) {
    f.metrics_listen = MetricsServer::DefaultAddress(f.listen);
  }
}

absl::StatusOr<std::string> FirstLine(const char* flag, const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line) || absl::StripAsciiWhitespace(line).empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " '", path, "' cannot be read or its first line is empty"));
  }
  return std::string(absl::StripAsciiWhitespace(line));
}

absl::StatusOr<std::string> JoinToken(const WorkerFlags& f) {
  if (!f.join_token.empty() || f.join_token_file.empty()) return f.join_token;
  return FirstLine("--join-token-file", f.join_token_file);
}

}  // namespace flatshard
