#include "client/up_command.h"

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

#include "client/cli_output.h"
#include "client/cluster_security.h"
#include "client/flatshard_client.h"
#include "client/up_job_start.h"
#include "client/up_signals.h"
#include "client/up_stop.h"
#include "client/up_supervisor.h"
#include "core/job_spec_yaml.h"
#include "storage/spec_files.h"

namespace flatshard {

CLI::App* AddUpCommand(CLI::App& app, UpCommandOptions& o) {
  CLI::App* up = app.add_subcommand(
      "up",
      "Start a local cluster (a coordinator and N workers) and keep it running until "
      "Ctrl-C (or until its coordinator, or every worker, is gone for good); then drive it from "
      "another terminal");
  up->add_option("--workers,-w", o.cluster.workers, "Number of worker daemons")
      ->capture_default_str();
  up->add_option("--device", o.cluster.device,
                 "The workers' device: cpu, cuda (one GPU each) or sim (the strict simulated GPU)")
      ->check(CLI::IsMember({"cpu", "cuda", "sim"}))
      ->capture_default_str();
  up->add_option("--comm", o.cluster.comm,
                 "The workers' collectives for device memory: auto, gloo or nccl")
      ->check(CLI::IsMember({"auto", "gloo", "nccl"}))
      ->capture_default_str();
  up->add_option("--gpus", o.cluster.gpus,
                 "With --device cuda: GPUs to use, worker i on the i-th (cycling; several "
                 "workers per GPU need --comm gloo); default: worker i on GPU i")
      ->delimiter(',');
  up->add_option("--compute-threads", o.cluster.compute_threads,
                 "GEMM threads of each CPU worker (0: OPENBLAS_NUM_THREADS if set, else an equal "
                 "share of this host's cores)")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  up->add_option("--listen", o.cluster.listen,
                 "Coordinator address (port 0: any free one; see --address-file)")
      ->capture_default_str();
  up->add_option("--job,-f", o.job_file, "Create this job (a job file) once the workers are up")
      ->check(CLI::ExistingFile);
  up->add_option("--stop-save-timeout", o.stop_save_timeout_s,
                 "On Ctrl-C or SIGTERM, first save the job unless its state is the checkpoint a "
                 "restart would restore (the next `up` on this state dir continues from the "
                 "save), waiting up to "
                 "this many seconds (a second Ctrl-C stops waiting). A save that fails, times out "
                 "or is given up makes up exit 1. 0: stop without saving")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  up->add_option("--address-file", o.address_file,
                 "Write the coordinator's address here once the cluster is up");
  up->add_option("--heartbeat-interval", o.cluster.heartbeat_interval_s,
                 "Seconds between worker heartbeats")
      ->capture_default_str();
  up->add_option("--heartbeat-timeout", o.cluster.heartbeat_timeout_s,
                 "Seconds without a heartbeat before a worker's rank is failed")
      ->capture_default_str();
  up->add_option("--collective-timeout", o.cluster.collective_timeout_s,
                 "Seconds a collective waits for a peer before failing")
      ->capture_default_str();
  up->add_option("--data-dir", o.cluster.data_dir, "Workers' data directory (FILE data sets)")
      ->capture_default_str();
  up->add_option("--checkpoint-dir", o.cluster.checkpoint_dir, "Workers' checkpoint directory")
      ->capture_default_str();
  up->add_option("--state-dir", o.cluster.state_dir,
                 "The coordinator's durable state (default: <checkpoint-dir>/.coordinator-state); "
                 "an `up` on the same state dir continues the job it holds");
  up->add_flag("--tls", o.tls,
               "Secure the cluster: mutual TLS on every channel (a CA and certificates made once "
               "in --security-dir), a fresh admin token and worker join token, an audit log");
  up->add_option("--security-dir", o.security_dir,
                 "Where --tls keeps its certificates and tokens (default: "
                 "<checkpoint-dir>/.security)");
  up->add_flag("--prometheus", o.prometheus,
               "Also run Prometheus (the Debian package) scraping every daemon, with "
               "flatshard's alert rules; prints its URL");
  up->add_option("--prometheus-listen", o.prometheus_options.listen,
                 "Where that Prometheus serves (port 0: any free one)")
      ->capture_default_str();
  up->add_option("--scrape-interval", o.prometheus_options.scrape_interval_s,
                 "Seconds between its scrapes and rule evaluations")
      ->capture_default_str();
  up->add_option("--prometheus-config-dir", o.prometheus_options.config_dir,
                 "Directory with prometheus-local.yml and its rule files (default: "
                 "share/flatshard/prometheus beside bin/)");
  up->add_option("--prometheus-data-dir", o.prometheus_options.data_dir,
                 "Keep its configuration and TSDB here (default: a temporary directory "
                 "removed on exit)");
  up->add_option("--prometheus-binary", o.prometheus_options.binary, "The prometheus executable")
      ->capture_default_str();
  up->add_option("--bin-dir", o.cluster.bin_dir,
                 "Where flatshard-coordinator and flatshard-worker are (default: beside this "
                 "program)");
  return up;
}

int RunUpCommand(const UpCommandOptions& o, std::ostream& out, std::ostream& err) {
  // Taken where `up` is ready for them (client/up_signals.h).
  BlockUpSignals();

  // Refuse bad Prometheus options before starting anything.
  if (o.prometheus) {
    if (absl::Status ok = LocalPrometheus::Check(o.prometheus_options); !ok.ok()) {
      return ReportError("up --prometheus", ok, err);
    }
  }
  // And a job the cluster cannot seat: it would wait for workers that never come.
  std::optional<v1::JobSpec> spec;
  if (!o.job_file.empty()) {
    absl::StatusOr<v1::JobSpec> loaded = LoadJobSpecFile(o.job_file);
    if (!loaded.ok()) return ReportError("up", loaded.status(), err);
    if (loaded->world_size() > o.cluster.workers) {
      return ReportError(
          "up",
          absl::InvalidArgumentError(absl::StrCat(
              "--job ", o.job_file, ": world_size ", loaded->world_size(), " needs ",
              loaded->world_size(), " workers and --workers is ", o.cluster.workers,
              "; start with --workers ", loaded->world_size(), " or lower world_size")),
          err);
    }
    spec = *std::move(loaded);
  }
  LocalClusterOptions cluster_options = o.cluster;
  if (cluster_options.state_dir.empty()) {
    cluster_options.state_dir = o.cluster.checkpoint_dir + "/.coordinator-state";
  }
  std::optional<ClusterSecurity> security;
  if (o.tls) {
    const std::string dir =
        o.security_dir.empty() ? o.cluster.checkpoint_dir + "/.security" : o.security_dir;
    absl::StatusOr<ClusterSecurity> prepared = PrepareClusterSecurity(dir);
    if (!prepared.ok()) return ReportError("up --tls", prepared.status(), err);
    security = *std::move(prepared);
    for (const RenewedCertificate& renewed : security->renewed) {
      out << "renewed " << dir << "/" << renewed.file << ".pem: it " << renewed.why << std::endl;
    }
    const std::vector<std::string> c = security->CoordinatorFlags();
    const std::vector<std::string> w = security->WorkerFlags();
    cluster_options.coordinator_flags.insert(cluster_options.coordinator_flags.end(), c.begin(),
                                             c.end());
    cluster_options.every_worker_flags.insert(cluster_options.every_worker_flags.end(), w.begin(),
                                              w.end());
  }
  // A Ctrl-C ends the wait for a daemon's start or restart.
  absl::StatusOr<int> interrupt_fd = StopSignalFd();
  if (!interrupt_fd.ok()) return ReportError("up", interrupt_fd.status(), err);
  const absl::Cleanup close_interrupt_fd = [fd = *interrupt_fd] { close(fd); };
  cluster_options.interrupt_fd = *interrupt_fd;
  out << "starting a coordinator and " << o.cluster.workers << " workers"
      << (security ? " (mutual TLS, tokens)" : "") << "..." << std::endl;
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(cluster_options);
  if (absl::IsCancelled(cluster.status())) {
    // The daemons started so far were stopped (LocalCluster's destructor).
    const int signal = TakeStopSignal(absl::ZeroDuration());
    out << "\n"
        << strsignal(signal != 0 ? signal : SIGINT) << " while the cluster started ("
        << cluster.status().message() << "): stopped" << std::endl;
    return kExitFailed;
  }
  if (!cluster.ok()) return ReportError("up", cluster.status(), err);
  out << "coordinator: " << (*cluster)->address() << "\n";
  out << "coordinator metrics: " << (*cluster)->coordinator_metrics() << "\n";
  for (const std::string& banner : (*cluster)->worker_banners()) out << "  " << banner << "\n";
  out << std::flush;  // seen now through a pipe (`up | tee`), not at READY
  // One line at a time, from this thread or the save's (SaveBeforeStop).
  std::mutex say_mu;
  const SayLine say = [&out, &say_mu](const std::string& line) {
    std::lock_guard<std::mutex> lock(say_mu);
    out << line << std::endl;
  };
  std::unique_ptr<LocalPrometheus> prometheus;
  if (o.prometheus) {
    LocalPrometheusOptions prometheus_options = o.prometheus_options;
    prometheus_options.interrupt_fd = *interrupt_fd;
    absl::StatusOr<std::unique_ptr<LocalPrometheus>> started = LocalPrometheus::Start(
        prometheus_options, (*cluster)->coordinator_metrics(), (*cluster)->worker_metrics());
    if (absl::IsCancelled(started.status())) {
      const int signal = TakeStopSignal(absl::ZeroDuration());
      out << "\n" << strsignal(signal != 0 ? signal : SIGINT) << " while Prometheus started: ";
      return StopCluster(nullptr, **cluster, say);
    }
    if (!started.ok()) return ReportError("up --prometheus", started.status(), err);
    prometheus = *std::move(started);
    out << "prometheus: " << prometheus->url() << " (targets: " << prometheus->url()
        << "/targets, alerts: " << prometheus->url() << "/alerts)" << std::endl;
  }

  const CoordinatorTarget target = security ? security->AdminTarget((*cluster)->address())
                                            : CoordinatorTarget{(*cluster)->address(), {}, "", ""};
  // The daemons' supervisor (client/up_supervisor.h) from here on, until a
  // stop signal or the coordinator is gone for good.
  UpSupervisor supervisor(**cluster, prometheus.get(), out, err);
  std::string job_name;
  int signal = 0;  // what ends the cluster: a stop signal, or SIGCHLD (the coordinator is gone)
  bool workers_gone = false;  // every worker exited, none to be started again
  if (spec.has_value()) {
    FlatshardClient client(target);
    UpJobStart start = StartUpJob(client, *spec, **cluster, supervisor, absl::Seconds(120), out);
    signal = start.signal;
    workers_gone = start.workers_gone;
    if (signal == 0 && !workers_gone && !start.job.ok()) {
      return ReportError("up", start.job.status(), err);
    }
    if (signal == 0 && !workers_gone) {
      job_name = spec->name();
      out << "job '" << job_name << "' is READY at step " << start.job->step() << " ("
          << start.job->units_size() << " units)\n";
    }
  }
  // The cluster (and its job) came up: there may be steps to save at the stop.
  const bool came_up = signal == 0 && !workers_gone;
  if (came_up) {
    if (!o.address_file.empty()) {
      const std::string tmp = o.address_file + ".tmp";
      std::ofstream(tmp) << (*cluster)->address() << "\n";
      std::error_code ec;
      std::filesystem::rename(tmp, o.address_file, ec);
      if (ec) {
        return ReportError(
            "up", absl::UnavailableError(absl::StrCat("--address-file: ", ec.message())), err);
      }
    }
    const std::string c = absl::StrCat(" -c ", (*cluster)->address());
    out << "\nThe cluster is up. From another terminal:\n";
    if (security) {
      out << "  export FLATSHARD_TLS_CERT=" << security->admin.cert
          << " FLATSHARD_TLS_KEY=" << security->admin.key
          << " FLATSHARD_TLS_CA=" << security->admin.ca
          << "\n  export FLATSHARD_TOKEN_FILE=" << security->admin_token_file
          << "   # the admin token of this cluster (audit log: " << security->dir
          << "/audit.log)\n";
    }
    if (job_name.empty()) {
      out << "  flatshard job create" << c << " -f examples/mlp-job.yaml\n";
      job_name = "mlp-demo";
    }
    out << "  flatshard train" << c << " -j " << job_name << " --steps 50\n"
        << "  flatshard workers" << c << "\n"
        << "  flatshard summon" << c << " -j " << job_name << " --out model.safetensors\n"
        << "Ctrl-C stops the cluster (saving the job first unless a restart would restore its "
           "state)."
        << std::endl;

    for (;;) {
      signal = TakeUpSignal(supervisor.UntilNextRetry());
      if (signal == 0) {
        supervisor.RetryDue();
      } else if (signal != SIGCHLD || !supervisor.OnChildExit()) {
        break;
      }
      if (supervisor.interrupted()) {
        signal = TakeStopSignal(absl::InfiniteDuration());  // pending: it interrupted
        break;
      }
      if (supervisor.EveryWorkerGone()) {
        workers_gone = true;
        break;
      }
    }
  }
  // A Ctrl-C pressed as the coordinator failed, or as the last worker went,
  // is not a second one, which StopCluster would take for "kill the daemons
  // now".
  if (signal == SIGCHLD || workers_gone) (void)TakeStopSignal(absl::ZeroDuration());
  // Down for good, or its restart interrupted: the cluster ended on a failure.
  const bool coordinator_down = (*cluster)->coordinator().Wait(absl::ZeroDuration()).has_value();
  if (workers_gone) {
    // No worker to save from; the coordinator keeps its job in the state
    // dir, and the next `up` on it rolls back to the job's history's newest
    // checkpoint (docs/fault-tolerance.md).
    out << "\nevery worker has exited and none is to be started again: ";
    (void)StopCluster(prometheus.get(), **cluster, say);
    say("not saved (no worker left): the next `up` on this state dir goes on from the job's last "
        "checkpoint");
    return kExitFailed;
  }
  out << "\n" << (signal == SIGCHLD ? "the coordinator is gone" : strsignal(signal)) << ": ";
  std::unique_ptr<StopSave> save;
  if (signal != SIGCHLD && came_up && o.stop_save_timeout_s > 0) {
    if (coordinator_down) {
      out << "not saving before stopping: the coordinator is down" << std::endl;
    } else {
      out << "saving before stopping, unless a restart would restore the job's state" << std::endl;
      save = SaveBeforeStop(target, absl::Seconds(o.stop_save_timeout_s), say);
    }
  }
  const bool waited = save == nullptr || save->phase.load() == StopSave::kDone;
  int code = StopCluster(prometheus.get(), **cluster, say);
  if (coordinator_down) code = kExitFailed;
  if (save == nullptr) return code;
  save->thread.join();
  if (!waited && save->Kept()) say("(the save finished as the cluster stopped: nothing is lost)");
  // A supervisor (or script) learns that trained steps were lost.
  return save->Kept() ? code : kExitFailed;
}

}  // namespace flatshard
