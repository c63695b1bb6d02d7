// flatshard-coordinator: Membership (registration, heartbeats, the rendezvous
// store) and JobService on one address, Prometheus metrics on another.
// SIGTERM or SIGINT stops serving (aborting the workers' collectives) and
// exits 0; the job stays in --state-dir as it was, for the next start.
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "metrics/build_info.h"
#include "metrics/metrics_server.h"
#include "metrics/rpc_metrics.h"
#include "metrics/scrape_collector.h"
#include "prometheus/registry.h"
#include "rpc/grpc_server.h"
#include "rpc/listen_policy.h"
#include "rpc/log_flags.h"
#include "rpc/mutex_deadlock_detection.h"
#include "rpc/stop_signals.h"
#include "rpc/tls_credentials.h"
#include "rpc/tls_flags.h"
#include "spdlog/spdlog.h"

#include "coordinator/coordinator.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/grpc_worker_client.h"
#include "coordinator/service/authenticator.h"
#include "coordinator/service/guarded_job_service.h"
#include "coordinator/service/job_service.h"
#include "coordinator/service/membership_service.h"
#include "coordinator/service/request_limits.h"
#include "coordinator/state_store.h"

namespace flatshard {
namespace {

struct Flags {
  std::string listen = "127.0.0.1:7070";
  double heartbeat_interval_s = 1.0;
  double heartbeat_timeout_s = 5.0;
  double configure_timeout_s = 120.0;
  double batch_timeout_s = 600.0;
  double stall_timeout_s = 300.0;
  int max_workers = 65536;
  double stalled_write_timeout_s = 60.0;
  double keepalive_interval_s = 30.0;
  std::string address_file;
  std::string checkpoint_root = "./checkpoints";
  std::string state_dir = "./flatshard-state";
  std::string metrics_listen;  // default: --listen's host, any port
  TlsFiles tls;
  std::string tokens_file;
  std::string audit_log;
  bool insecure = false;
  RequestLimitSettings limits;
};

// Written whole then renamed, so a reader never sees half an address.
bool WriteAddressFile(const std::string& path, const std::string& address) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << address << "\n";
    if (!out) return false;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  return !ec;
}

int Run(const Flags& f) {
  if (f.heartbeat_interval_s <= 0 || f.heartbeat_timeout_s <= f.heartbeat_interval_s) {
    std::cerr << "flatshard-coordinator: --heartbeat-timeout (" << f.heartbeat_timeout_s
              << ") must exceed --heartbeat-interval (" << f.heartbeat_interval_s
              << "), which must be positive\n";
    return 2;
  }
  // Durations in seconds: finite, and positive, or >= 0 where 0 means `zero`.
  struct SecondsFlag {
    const char* name;
    double value;
    const char* zero;  // null: 0 is refused
  };
  for (const SecondsFlag& flag :
       {SecondsFlag{"--stalled-write-timeout", f.stalled_write_timeout_s, "never"},
        SecondsFlag{"--keepalive-interval", f.keepalive_interval_s, "no pings"},
        SecondsFlag{"--batch-timeout", f.batch_timeout_s, nullptr},
        SecondsFlag{"--stall-timeout", f.stall_timeout_s, "never"}}) {
    if (std::isfinite(flag.value) && (flag.zero != nullptr ? flag.value >= 0 : flag.value > 0)) {
      continue;
    }
    std::cerr << "flatshard-coordinator: " << flag.name << " must be a number of seconds "
              << (flag.zero != nullptr ? absl::StrCat(">= 0 (0: ", flag.zero, ")") : "> 0")
              << ", got " << flag.value << "\n";
    return 2;
  }
  if (f.max_workers < 1) {
    std::cerr << "flatshard-coordinator: --max-workers must be at least 1, got " << f.max_workers
              << "\n";
    return 2;
  }
  absl::StatusOr<std::optional<TlsMaterial>> tls = LoadTls(f.tls, TlsRole::kServer);
  if (!tls.ok()) {
    std::cerr << "flatshard-coordinator: " << tls.status().message() << "\n";
    return 2;
  }
  const TlsMaterial* tls_material = tls->has_value() ? &**tls : nullptr;
  AuthenticatorOptions auth_options;
  auth_options.mutual_tls = tls_material != nullptr && !tls_material->ca_pem.empty();
  auth_options.audit_log_path = f.audit_log;
  if (!f.tokens_file.empty()) {
    absl::StatusOr<TokenTable> tokens = TokenTable::Load(f.tokens_file);
    if (!tokens.ok()) {
      std::cerr << "flatshard-coordinator: " << tokens.status().message() << "\n";
      return 2;
    }
    auth_options.tokens = *std::move(tokens);
  }
  absl::StatusOr<std::unique_ptr<Authenticator>> auth = Authenticator::Create(auth_options);
  if (!auth.ok()) {
    std::cerr << "flatshard-coordinator: " << auth.status().message() << "\n";
    return 2;
  }
  if (absl::Status exposed = CheckListenExposure(
          "--listen", f.listen, tls_material != nullptr && !(*auth)->open(),
          "TLS (--tls-cert/--tls-key) and authenticated callers (--tokens-file or --tls-ca)",
          f.insecure);
      !exposed.ok()) {
    std::cerr << "flatshard-coordinator: " << exposed.message() << "\n";
    return 2;
  }
  if (f.limits.max_streams_per_client < 1 || f.limits.expensive_calls_per_minute < 1) {
    std::cerr << "flatshard-coordinator: --max-streams-per-client and "
                 "--expensive-calls-per-minute must be at least 1\n";
    return 2;
  }
  const sigset_t signals = BlockStopSignals();  // before any thread starts

  // Declared before what they observe, so they outlive it.
  auto registry = std::make_shared<prometheus::Registry>();
  AddBuildInfo(*registry, "coordinator");
  CoordinatorMetrics metrics(*registry);

  absl::StatusOr<std::unique_ptr<StateStore>> state;
  if (!f.state_dir.empty()) {
    state = StateStore::Open(f.state_dir);
    if (!state.ok()) {
      std::cerr << "flatshard-coordinator: " << state.status().message() << "\n";
      return 1;
    }
  }

  CoordinatorOptions options;
  options.state = state.ok() ? state->get() : nullptr;
  options.heartbeat_interval = absl::Seconds(f.heartbeat_interval_s);
  options.heartbeat_timeout = absl::Seconds(f.heartbeat_timeout_s);
  options.max_workers = f.max_workers;
  options.job.configure_timeout = absl::Seconds(f.configure_timeout_s);
  options.job.batch.timeout = absl::Seconds(f.batch_timeout_s);
  options.job.batch.stall_timeout = absl::Seconds(f.stall_timeout_s);
  options.job.checkpoint_root = f.checkpoint_root;
  options.job.observer = &metrics;
  std::shared_ptr<grpc::ChannelCredentials> worker_credentials =
      ChannelCredentials(tls_material, kWorkerIdentity);
  options.job.connect = [worker_credentials](const WorkerRecord& worker,
                                             size_t world_size) -> std::unique_ptr<WorkerClient> {
    return std::make_unique<GrpcWorkerClient>(worker.address, worker_credentials,
                                              worker.command_token, WorkerChannelIdle(world_size));
  };
  auto coordinator = std::make_unique<Coordinator>(options);
  if (absl::Status restored = coordinator->RestoreState(); !restored.ok()) {
    std::cerr << "flatshard-coordinator: --state-dir: " << restored.message() << "\n";
    return 1;
  }
  MembershipService membership(&coordinator->members(), &coordinator->store(),
                               options.heartbeat_interval, auth->get());
  Coordinator* c = coordinator.get();
  membership.set_abort_query([c](const std::string& id) { return c->AbortEpochFor(id); });
  JobServiceOptions job_service_options;
  job_service_options.stalled_write_timeout = absl::Seconds(f.stalled_write_timeout_s);
  JobServiceImpl jobs(c, job_service_options);
  RequestLimits limits(f.limits);
  GuardedJobService guarded_jobs(&jobs, auth->get(), &limits);
  GrpcServer::Interceptors interceptors;
  interceptors.push_back(RpcMetricsInterceptor(*registry));
  absl::StatusOr<std::unique_ptr<GrpcServer>> server =
      GrpcServer::Start(f.listen, {&membership, &guarded_jobs}, std::move(interceptors),
                        ServerCredentials(tls_material), absl::Seconds(f.keepalive_interval_s));
  if (!server.ok()) {
    std::cerr << "flatshard-coordinator: --listen: " << server.status().message() << "\n";
    return 1;
  }
  std::unique_ptr<MetricsServer> metrics_server;
  if (!f.metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<MetricsServer>> started = MetricsServer::Start(f.metrics_listen);
    if (!started.ok()) {
      std::cerr << "flatshard-coordinator: --metrics-listen: " << started.status().message()
                << "\n";
      return 1;
    }
    metrics_server = *std::move(started);
    metrics_server->Serve(registry);
    metrics_server->Serve(std::make_shared<ScrapeCollector>(
        [&metrics, c](ScrapedGauges& g) { metrics.AddScrapeGauges(*c, absl::Now(), g); }));
  }
  coordinator->Start();
  const std::string address = (*server)->address();
  if (!f.address_file.empty() && !WriteAddressFile(f.address_file, address)) {
    std::cerr << "flatshard-coordinator: --address-file: cannot write " << f.address_file << "\n";
    return 1;
  }
  std::cout << "flatshard-coordinator listening on " << address << std::endl;
  spdlog::info("flatshard-coordinator: {}, {}",
               tls_material == nullptr   ? "plaintext"
               : auth_options.mutual_tls ? "TLS with client certificates (mutual TLS)"
                                         : "TLS",
               (*auth)->open() ? "open to every caller (no --tokens-file or --tls-ca)"
                               : "callers authenticated");
  if (metrics_server != nullptr) {
    std::cout << "flatshard-coordinator metrics on " << metrics_server->address() << std::endl;
  }

  int signal = 0;
  sigwait(&signals, &signal);
  spdlog::info("flatshard-coordinator: {} received, shutting down", strsignal(signal));
  metrics_server.reset();  // its scrapes read the coordinator
  // Stopping the job first makes the services' long calls (Train, WatchEvents)
  // return; the server then stops with no handler left inside the coordinator,
  // and only then is the coordinator's state destroyed.
  coordinator->Shutdown(absl::StrCat("the coordinator received ", strsignal(signal)));
  (*server)->Shutdown();
  server->reset();
  coordinator.reset();
  return 0;
}

}  // namespace
}  // namespace flatshard

namespace {

int Main(int argc, char** argv) {
  flatshard::Flags f;
  CLI::App app{
      "flatshard-coordinator: holds the job (model, wrap policy, ranks, state-dict settings), "
      "membership and the rendezvous store, and drives the workers over gRPC."};
  app.add_option("--listen", f.listen, "Address to serve on (port 0: any free one)")
      ->capture_default_str();
  app.add_option("--heartbeat-interval", f.heartbeat_interval_s,
                 "Seconds between a worker's heartbeats")
      ->capture_default_str();
  app.add_option("--heartbeat-timeout", f.heartbeat_timeout_s,
                 "Seconds without a heartbeat before a worker's rank is failed")
      ->capture_default_str();
  app.add_option("--configure-timeout", f.configure_timeout_s,
                 "Seconds the workers have to configure a job (build units, rendezvous)")
      ->capture_default_str();
  app.add_option("--max-workers", f.max_workers,
                 "Worker daemons that may register (membership ranks 0 to N-1); more are refused")
      ->capture_default_str();
  app.add_option(
         "--batch-timeout", f.batch_timeout_s,
         "Seconds one batch (a step, a checkpoint save or load, a restore) may take end to end")
      ->capture_default_str();
  app.add_option("--stall-timeout", f.stall_timeout_s,
                 "Seconds a rank may go without progress (no step command, no checkpoint chunk "
                 "written or read) on a batch other ranks finished, or in an async save's "
                 "background write, before it is failed as stuck and the job recovers without "
                 "waiting out --batch-timeout; 0: never")
      ->capture_default_str();
  app.add_option("--checkpoint-root", f.checkpoint_root,
                 "Directory holding <job>/<checkpoint>/ (the workers' --checkpoint-dir, "
                 "shared)")
      ->capture_default_str();
  app.add_option("--state-dir", f.state_dir,
                 "Directory of the durable state (SQLite: jobs, workers, checkpoints, the last "
                 "batch); a coordinator restarted on it takes its job and workers back. Empty: "
                 "memory only")
      ->capture_default_str();
  CLI::Option* metrics_listen =
      app.add_option("--metrics-listen", f.metrics_listen,
                     "Address of the Prometheus /metrics endpoint (default: the --listen host, any "
                     "free port; printed "
                     "at start; empty: no metrics)");
  app.add_option("--address-file", f.address_file,
                 "Write the address served on (host:port) to this file once listening");
  flatshard::AddTlsFlags(app, f.tls, "clients and workers");
  app.add_option("--tokens-file", f.tokens_file,
                 "Bearer tokens, one per line '<sha256-hex> <name> <role>' (roles viewer, "
                 "operator, admin; worker for join tokens); make them with `flatshard token "
                 "create`. With it, every JobService call needs a token");
  app.add_option("--audit-log", f.audit_log,
                 "Append one line per state-changing call (who, what, when, result) to this file");
  app.add_flag("--insecure", f.insecure,
               "Serve on an address other hosts can reach without TLS and authentication (a "
               "trusted private network only; warns at every start)");
  app.add_option("--max-streams-per-client", f.limits.max_streams_per_client,
                 "Concurrent streaming calls (train, watch, summon, checkpoints) per client")
      ->capture_default_str();
  app.add_option("--expensive-calls-per-minute", f.limits.expensive_calls_per_minute,
                 "Plan, SummonFullParams and SaveCheckpoint calls per client per minute")
      ->capture_default_str();
  app.add_option("--stalled-write-timeout", f.stalled_write_timeout_s,
                 "Seconds a streaming call (train, watch, summon) may wait for its client to "
                 "read before it is cancelled; a summon holds the job meanwhile (0: never)")
      ->capture_default_str();
  app.add_option("--keepalive-interval", f.keepalive_interval_s,
                 "Seconds without traffic after which the coordinator pings a client or worker "
                 "with calls in flight; one that does not answer within as long (5 to 20 s) is "
                 "dropped and its streams end (0: no pings)")
      ->capture_default_str();
  std::string log_level;
  flatshard::AddLogLevelFlag(app, log_level);
  CLI11_PARSE(app, argc, argv);
  if (metrics_listen->count() == 0) {
    f.metrics_listen = flatshard::MetricsServer::DefaultAddress(f.listen);
  }
  flatshard::InstallStderrLogger(log_level);
  return flatshard::Run(f);
}

}  // namespace

int main(int argc, char** argv) {
  flatshard::TurnOffMutexDeadlockDetection();
  // CLI11 reports through exceptions and parsing handles them; anything else
  // (a failed allocation) still ends with a message, not std::terminate.
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
