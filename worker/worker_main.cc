// flatshard-worker: one per device. Serves WorkerService, registers with the
// coordinator, heartbeats, hosts the data plane the coordinator configures,
// and serves Prometheus metrics. SIGTERM or SIGINT: abort the job's
// collectives, stop serving, exit 0. Exit 3: wedged (a batch that did not
// let go of an abort; worker/service/abort_watchdog.h).
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <unistd.h>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "metrics/build_info.h"
#include "metrics/metrics_server.h"
#include "metrics/rpc_metrics.h"
#include "metrics/scrape_collector.h"
#include "prometheus/registry.h"
#include "rpc/call_metadata.h"
#include "rpc/grpc_server.h"
#include "rpc/host_port.h"
#include "rpc/keepalive.h"
#include "rpc/listen_policy.h"
#include "rpc/log_flags.h"
#include "rpc/mutex_deadlock_detection.h"
#include "rpc/secrets.h"
#include "rpc/stop_signals.h"
#include "rpc/tls_credentials.h"
#include "spdlog/spdlog.h"

#include "storage/fault_injecting_file_system.h"
#include "worker/comm/grpc_store.h"
#include "worker/device/device_factory.h"
#include "worker/device/host/cblas_api.h"
#include "worker/runtime/runtime_groups.h"
#include "worker/service/guarded_worker_service.h"
#include "worker/service/heartbeat_loop.h"
#include "worker/service/worker_identity.h"
#include "worker/service/worker_metrics.h"
#include "worker/service/worker_service.h"
#include "worker/worker_flags.h"

namespace flatshard {
namespace {

// The GPU a worker drives by default: its local rank on the node, as launchers
// (torchrun, Slurm's srun, `flatshard up`) set LOCAL_RANK; else the first.
int DefaultGpu() {
  const char* local_rank = std::getenv("LOCAL_RANK");
  int gpu = 0;
  if (local_rank != nullptr && absl::SimpleAtoi(local_rank, &gpu) && gpu >= 0) return gpu;
  return 0;
}

int Run(const WorkerFlags& f) {
  // Taken by sigwait below; before anything starts a thread (the host
  // device's streams are threads). A thread started earlier took a second
  // SIGTERM, sent while the worker was shutting down after the first, with
  // the default action: killed.
  const sigset_t signals = BlockStopSignals();

  // The device first: a worker that cannot compute must not register.
  absl::StatusOr<DeviceKind> kind = ParseDeviceKind(f.device);
  absl::StatusOr<CommBackend> comm = ParseCommBackend(f.comm);
  if (!kind.ok() || !comm.ok()) {
    std::cerr << "flatshard-worker: " << (!kind.ok() ? "--device: " : "--comm: ")
              << (!kind.ok() ? kind.status() : comm.status()).message() << "\n";
    return 2;
  }
  if (absl::StatusOr<CommBackend> resolved = ResolveCommBackend(*comm, *kind); !resolved.ok()) {
    std::cerr << "flatshard-worker: --comm: " << resolved.status().message() << "\n";
    return 2;
  }
  if (f.gpu >= 0 && *kind != DeviceKind::kCuda) {
    std::cerr << "flatshard-worker: --gpu " << f.gpu << " is only meaningful with --device cuda, "
              << "not --device " << f.device << "\n";
    return 2;
  }
  DeviceOptions device_options;
  device_options.kind = *kind;
  device_options.gpu = f.gpu >= 0 ? f.gpu : DefaultGpu();
  device_options.sim.seed = f.sim_seed;
  device_options.sim.max_delay_us = f.sim_max_delay_us;
  absl::StatusOr<std::shared_ptr<Device>> device = CreateDevice(device_options);
  if (!device.ok()) {
    std::cerr << "flatshard-worker: --device " << f.device << ": " << device.status().message()
              << "\n";
    return 2;
  }
  if (*kind != DeviceKind::kCuda) {
    if (f.compute_threads > 0) Cblas().set_num_threads(f.compute_threads);
    // Which OpenBLAS kernels the CPU path runs, and on how many threads, for
    // anyone comparing step times.
    const char* forced = std::getenv("OPENBLAS_CORETYPE");
    spdlog::info("flatshard-worker: host GEMMs run OpenBLAS's {} kernels ({}) on {} thread(s)",
                 Cblas().corename(),
                 forced != nullptr ? absl::StrCat("OPENBLAS_CORETYPE=", forced) : "chosen by CPU",
                 Cblas().num_threads());
  }
  absl::StatusOr<std::optional<TlsMaterial>> tls = LoadTls(f.tls, TlsRole::kServer);
  if (!tls.ok()) {
    std::cerr << "flatshard-worker: " << tls.status().message() << "\n";
    return 2;
  }
  const TlsMaterial* tls_material = tls->has_value() ? &**tls : nullptr;
  absl::StatusOr<std::string> join_token = JoinToken(f);
  // Fresh per process unless given (a launcher that must reach its workers
  // directly, such as the test harness, shares one).
  absl::StatusOr<std::string> command_token =
      f.command_token_file.empty() ? RandomSecret()
                                   : FirstLine("--command-token-file", f.command_token_file);
  if (!join_token.ok() || !command_token.ok()) {
    std::cerr << "flatshard-worker: "
              << (!join_token.ok() ? join_token.status() : command_token.status()).message()
              << "\n";
    return 2;
  }
  if (absl::Status exposed = CheckListenExposure("--listen", f.listen, tls_material != nullptr,
                                                 "TLS (--tls-cert/--tls-key)", f.insecure);
      !exposed.ok()) {
    std::cerr << "flatshard-worker: " << exposed.message() << "\n";
    return 2;
  }
  // An id stable across restarts: the coordinator keeps a worker's rank by it.
  std::unique_ptr<WorkerIdentity> identity;
  std::string worker_id = f.worker_id;
  // With --worker-id the state dir keeps only the id's secret, and only one
  // given explicitly: the default (under the working directory) may not be
  // writable where ids come from the orchestrator (a read-only container).
  const bool claim_seat = worker_id.empty() ? !f.state_dir.empty() : f.state_dir_given;
  if (claim_seat && !f.state_dir.empty()) {
    absl::StatusOr<std::unique_ptr<WorkerIdentity>> claimed =
        worker_id.empty()
            ? WorkerIdentity::Claim(f.state_dir, f.advertise_host,
                                    *kind == DeviceKind::kCuda ? device_options.gpu : -1)
            : WorkerIdentity::ClaimId(f.state_dir, worker_id);
    if (!claimed.ok()) {
      std::cerr << "flatshard-worker: " << claimed.status().message() << "\n";
      return 1;
    }
    identity = *std::move(claimed);
    worker_id = identity->id();
  }
  if (worker_id.empty()) worker_id = absl::StrCat(f.advertise_host, "-", getpid());
  // Without a seat the identity lives as long as the process: a restarted
  // daemon is refused the id until the old registration has missed heartbeats.
  const std::string identity_secret = identity != nullptr ? identity->secret() : RandomSecret();
  grpc::ChannelArguments channel_args;
  ApplyClientKeepalive(channel_args);  // a StoreWait notices a coordinator that vanished
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
      f.coordinator, ChannelCredentials(tls_material, kCoordinatorIdentity), channel_args);
  auto call_credentials = std::make_shared<WorkerCallCredentials>(*join_token);
  // Declared before the service they observe, so they outlive it.
  auto registry = std::make_shared<prometheus::Registry>();
  AddBuildInfo(*registry, "worker");
  WorkerMetrics metrics(*registry);

  // Checkpoint files go through a file system that fails on purpose when a
  // fault-injection test asks for it.
  std::unique_ptr<FaultInjectingFileSystem> faulty_files;
  if (!f.inject_file_faults.empty()) {
    absl::StatusOr<std::vector<FileFault>> faults = ParseFileFaults(f.inject_file_faults);
    if (!faults.ok()) {
      std::cerr << "flatshard-worker: --inject-file-faults: " << faults.status().message() << "\n";
      return 2;
    }
    faulty_files =
        std::make_unique<FaultInjectingFileSystem>(FileSystem::Default(), *std::move(faults));
    spdlog::warn("--inject-file-faults {}: checkpoint writes will fail on purpose",
                 f.inject_file_faults);
  }

  WorkerServiceOptions options;
  options.file_system = faulty_files.get();
  options.data_dir = f.data_dir;
  options.checkpoint_dir = f.checkpoint_dir;
  options.gloo.hostname =
      f.advertise_host;  // bare (FinishWorkerFlags): getaddrinfo takes no brackets
  options.gloo.timeout = absl::Seconds(f.collective_timeout_s);
  options.abort_grace = absl::Seconds(f.abort_grace_s);
  if (f.abort_grace_s > 0 && f.abort_grace_s <= f.collective_timeout_s) {
    // A Gloo connection an abort cannot interrupt still ends at the
    // collective timeout: a grace shorter than that ends healthy workers.
    spdlog::warn(
        "--abort-grace {} s is not longer than --collective-timeout {} s: a worker blocked in a "
        "Gloo connection when its job is aborted may count itself wedged and exit",
        f.abort_grace_s, f.collective_timeout_s);
  }
  options.on_wedged = [worker_id](const std::string& what) {
    // Destructors would wait for the very work that does not return: end
    // the process as it is, with a status its supervisor can tell apart.
    // The log itself may block (a stderr on the same hung mount), so the
    // exit does not wait for it beyond a few seconds.
    std::thread([] {
      absl::SleepFor(absl::Seconds(5));
      std::_Exit(kWedgedExitCode);
    }).detach();
    spdlog::critical(
        "flatshard-worker {}: wedged, exiting with status {} to be restarted clean: {}", worker_id,
        kWedgedExitCode, what);
    spdlog::default_logger()->flush();
    std::_Exit(kWedgedExitCode);
  };
  options.gloo.same_host.enabled = f.same_host_copies;
  options.device = *device;
  options.comm = *comm;
  options.store_for_prefix =
      [channel, call_credentials](const std::string& prefix) -> std::shared_ptr<Store> {
    return std::make_shared<PrefixStore>(prefix,
                                         std::make_shared<GrpcStore>(channel, call_credentials));
  };
  options.observer_for_job = [&metrics](const std::string& job, int rank) {
    return metrics.ForJob(job, rank);
  };
  WorkerServiceImpl service(options);
  // Only the coordinator this worker registers with may command it: it learns
  // the command token from the registration (and, under mutual TLS, must
  // present the coordinator's certificate).
  GuardedWorkerService guarded(
      &service,
      WorkerCallPolicy{*command_token, tls_material != nullptr && !tls_material->ca_pem.empty()});
  GrpcServer::Interceptors interceptors;
  interceptors.push_back(RpcMetricsInterceptor(*registry));
  absl::StatusOr<std::unique_ptr<GrpcServer>> server = GrpcServer::Start(
      f.listen, {&guarded}, std::move(interceptors), ServerCredentials(tls_material));
  if (!server.ok()) {
    std::cerr << "flatshard-worker: --listen: " << server.status().message() << "\n";
    return 1;
  }
  const std::string address = JoinHostPort(f.advertise_host, (*server)->port());
  std::unique_ptr<MetricsServer> metrics_server;
  std::string metrics_address;
  if (!f.metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<MetricsServer>> started = MetricsServer::Start(f.metrics_listen);
    if (!started.ok()) {
      std::cerr << "flatshard-worker: --metrics-listen: " << started.status().message() << "\n";
      return 1;
    }
    metrics_server = *std::move(started);
    metrics_server->Serve(registry);
    metrics_server->Serve(std::make_shared<ScrapeCollector>(
        [&service](ScrapedGauges& g) { WorkerMetrics::AddSnapshotGauges(service.Snapshot(), g); }));
    metrics_address = JoinHostPort(f.advertise_host, metrics_server->port());
    if (IsLoopbackAddress(f.metrics_listen) && !IsLoopbackAddress(address)) {
      spdlog::warn(
          "--metrics-listen {} accepts loopback connections only, but this worker advertises "
          "{}: a Prometheus on another host cannot scrape it (listen on 0.0.0.0 instead)",
          f.metrics_listen, f.advertise_host);
    }
  }

  v1::RegisterRequest registration;
  registration.set_worker_id(worker_id);
  registration.set_host(f.advertise_host);
  registration.set_device(std::string(DeviceKindName(*kind)));
  registration.set_device_name((*device)->name());
  registration.set_address(address);
  registration.set_requested_rank(f.rank);
  registration.set_metrics_address(metrics_address);
  registration.set_identity_secret(identity_secret);
  registration.set_command_token(*command_token);
  registration.set_incarnation(RandomSecret());  // this process's, in every re-registration
  HeartbeatLoop heartbeat(channel, registration, &service, call_credentials,
                          absl::Seconds(f.coordinator_timeout_s));
  service.set_batch_end_observer([&heartbeat] { heartbeat.BatchEnded(); });
  absl::StatusOr<int> rank = heartbeat.Register(absl::Seconds(f.connect_timeout_s));
  if (!rank.ok()) {
    // The server already serves, and `heartbeat` goes before it: a batch
    // ending meanwhile must not reach it.
    service.set_batch_end_observer(nullptr);
    std::cerr << "flatshard-worker: cannot register with the coordinator at " << f.coordinator
              << ": " << rank.status().message() << "\n";
    return 1;
  }
  std::cout << "flatshard-worker " << worker_id << " rank " << *rank << " on " << (*device)->name()
            << " listening on " << address
            << (metrics_address.empty() ? "" : absl::StrCat(", metrics on ", metrics_address))
            << std::endl;
  heartbeat.Start();

  int signal = 0;
  sigwait(&signals, &signal);
  spdlog::info("flatshard-worker {}: {} received, shutting down", worker_id, strsignal(signal));
  heartbeat.Stop();
  service.set_batch_end_observer(nullptr);  // batches still ending must not reach it
  service.Shutdown("worker shutting down");
  metrics_server.reset();
  (*server)->Shutdown();
  return 0;
}

}  // namespace
}  // namespace flatshard

namespace {

int Main(int argc, char** argv) {
  flatshard::WorkerFlags f;
  CLI::App app{
      "flatshard-worker: a worker daemon (one per device). It registers with the coordinator, "
      "serves WorkerService and runs the FSDP data plane the coordinator configures."};
  flatshard::AddWorkerFlags(app, f);
  std::string log_level;
  flatshard::AddLogLevelFlag(app, log_level);
  CLI11_PARSE(app, argc, argv);
  flatshard::FinishWorkerFlags(app, f);
  flatshard::InstallStderrLogger(log_level);
  return flatshard::Run(f);
}

}  // namespace

int main(int argc, char** argv) {
  flatshard::TurnOffMutexDeadlockDetection();
  // Gloo writes to its pairs with writev, without MSG_NOSIGNAL: a write to a
  // peer that aborted or died would kill this daemon with SIGPIPE, where the
  // write's EPIPE fails the collective (found by
  // GlooCommunicatorTest.AnAbortAnywhereInTheRendezvousEndsItCleanly).
  std::signal(SIGPIPE, SIG_IGN);
  // CLI11 reports through exceptions and parsing handles them; anything else
  // (a failed allocation) still ends with a message, not std::terminate.
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
