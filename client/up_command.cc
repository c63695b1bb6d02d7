#include "client/up_command.h"

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

#include "client/cli_output.h"
#include "client/cluster_security.h"
#include "client/flatshard_client.h"
#include "client/save_before_stop.h"
#include "client/up_supervisor.h"
#include "core/job_spec_yaml.h"
#include "storage/spec_files.h"

namespace flatshard {

CLI::App* AddUpCommand(CLI::App& app, UpCommandOptions& o) {
  CLI::App* up = app.add_subcommand(
      "up",
      "Start a local cluster (a coordinator and N workers) and keep it running until "
      "Ctrl-C; then drive it from another terminal");
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
                 "On Ctrl-C or SIGTERM, first save the job if its newest checkpoint does not hold "
                 "its step (the next `up` on this state dir continues from it), waiting up to "
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

namespace {

// The signals that stop `up`: SIGINT (Ctrl-C) and SIGTERM.
sigset_t StopSignals() {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  return stop_signals;
}

// A stop signal that arrived while they are blocked; 0: none.
int PendingStopSignal() {
  const sigset_t stop_signals = StopSignals();
  const timespec now{};
  const int got = sigtimedwait(&stop_signals, nullptr, &now);
  return got > 0 ? got : 0;
}

// Stops Prometheus and the cluster (the coordinator first); one more stop
// signal meanwhile kills them all rather than wait out their grace.
int StopCluster(LocalPrometheus* prometheus, LocalCluster& cluster,
                const std::function<void(const std::string&)>& say) {
  say("stopping the cluster... (Ctrl-C again to kill the daemons now)");
  std::atomic<bool> stopped{false};
  std::thread impatient([&] {
    const sigset_t stop_signals = StopSignals();
    while (!stopped.load()) {
      // Polled: nothing wakes a sigtimedwait when Stop() returns.
      const timespec slice = absl::ToTimespec(absl::Milliseconds(100));
      const int got = sigtimedwait(&stop_signals, nullptr, &slice);
      if (got == SIGINT || got == SIGTERM) {
        say(absl::StrCat(strsignal(got), " again: killing the daemons"));
        if (prometheus != nullptr) prometheus->Kill();
        cluster.KillAll();
        return;
      }
    }
  });
  bool clean = prometheus == nullptr || prometheus->Stop();
  clean &= cluster.Stop();
  stopped.store(true);
  impatient.join();
  const bool killed = cluster.KilledAny() || (prometheus != nullptr && prometheus->killed());
  say(clean    ? "stopped cleanly"
      : killed ? "stopped (some daemons had to be killed)"
               : "stopped (not every daemon exited cleanly; the logs above say why)");
  return clean ? kExitOk : kExitFailed;
}

// The save before stopping, shared between its thread and the one waiting
// for it (which may stop waiting first).
struct StopSave {
  enum Phase { kListing, kSaving, kDone };
  std::atomic<int> phase{kListing};
  std::atomic<bool> kept{false};  // at kDone: every job saved, or none needed it
  std::thread thread;             // joined after the cluster stops
  // Whether the job's state is kept: a save given up on may still have
  // finished before the coordinator stopped.
  bool Kept() const { return phase.load() == kDone && kept.load(); }
};

// Saves what the workers alone hold (client/save_before_stop.h) on a thread
// of its own, while this one listens for a second stop signal; returns when
// the save is done, that signal came or `timeout` passed. A save given up on
// ends with the coordinator, so its thread is joined after the cluster
// stops. `say` is called from both threads.
std::unique_ptr<StopSave> SaveBeforeStop(const CoordinatorTarget& target, absl::Duration timeout,
                                         const std::function<void(const std::string&)>& say) {
  auto save = std::make_unique<StopSave>();
  StopSave* s = save.get();  // outlives the thread: joined before it is destroyed
  save->thread = std::thread([target, say, s] {
    FlatshardClient client(target);
    absl::StatusOr<std::vector<UnsavedJob>> jobs = FindUnsavedJobs(client);
    if (!jobs.ok()) {
      say(absl::StrCat("not saving before stopping: ", jobs.status().message()));
    } else if (jobs->empty()) {
      s->kept.store(true);
    } else {
      s->phase.store(StopSave::kSaving);
      say("(Ctrl-C again to stop without saving)");
      s->kept.store(SaveUnsavedJobs(client, *jobs, absl::Now(), say).ok());
    }
    s->phase.store(StopSave::kDone);
  });
  // What giving up costs, by how far the save got.
  const auto lost = [s] {
    return s->phase.load() == StopSave::kListing
               ? std::string("whether a job's newest checkpoint holds its step is not known")
               : std::string("what it had not saved is lost");
  };
  const sigset_t stop_signals = StopSignals();
  const absl::Time give_up = absl::Now() + timeout;
  while (s->phase.load() != StopSave::kDone) {
    if (absl::Now() >= give_up) {
      say(absl::StrCat("the save did not finish in ", absl::FormatDuration(timeout),
                       " (--stop-save-timeout); stopping without it: ", lost()));
      return save;
    }
    // Polled: nothing wakes a sigtimedwait when the other thread finishes.
    const timespec slice =
        absl::ToTimespec(std::min(absl::Milliseconds(100), give_up - absl::Now()));
    const int got = sigtimedwait(&stop_signals, nullptr, &slice);
    if (got == SIGINT || got == SIGTERM) {
      say(absl::StrCat(strsignal(got), " again: stopping without waiting for the save: ", lost()));
      return save;
    }
  }
  // A Ctrl-C pressed as the save finished meant "stop waiting": not "kill
  // the daemons", which StopCluster would take it for.
  (void)PendingStopSignal();
  return save;
}

}  // namespace

int RunUpCommand(const UpCommandOptions& o, std::ostream& out, std::ostream& err) {
  // Taken by sigwait below; children start with an empty mask.
  sigset_t signals = StopSignals();
  // A worker that exits: restarted if it ended itself wedged (below).
  sigaddset(&signals, SIGCHLD);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

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
    const std::vector<std::string> c = security->CoordinatorFlags();
    const std::vector<std::string> w = security->WorkerFlags();
    cluster_options.coordinator_flags.insert(cluster_options.coordinator_flags.end(), c.begin(),
                                             c.end());
    cluster_options.every_worker_flags.insert(cluster_options.every_worker_flags.end(), w.begin(),
                                              w.end());
  }
  out << "starting a coordinator and " << o.cluster.workers << " workers"
      << (security ? " (mutual TLS, tokens)" : "") << "..." << std::endl;
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(cluster_options);
  if (!cluster.ok()) return ReportError("up", cluster.status(), err);
  out << "coordinator: " << (*cluster)->address() << "\n";
  out << "coordinator metrics: " << (*cluster)->coordinator_metrics() << "\n";
  for (const std::string& banner : (*cluster)->worker_banners()) out << "  " << banner << "\n";
  std::unique_ptr<LocalPrometheus> prometheus;
  if (o.prometheus) {
    absl::StatusOr<std::unique_ptr<LocalPrometheus>> started = LocalPrometheus::Start(
        o.prometheus_options, (*cluster)->coordinator_metrics(), (*cluster)->worker_metrics());
    if (!started.ok()) return ReportError("up --prometheus", started.status(), err);
    prometheus = *std::move(started);
    out << "prometheus: " << prometheus->url() << " (targets: " << prometheus->url()
        << "/targets, alerts: " << prometheus->url() << "/alerts)" << std::endl;
  }

  // One line at a time, from this thread or the save's (SaveBeforeStop).
  std::mutex say_mu;
  const std::function<void(const std::string&)> say = [&out, &say_mu](const std::string& line) {
    std::lock_guard<std::mutex> lock(say_mu);
    out << line << std::endl;
  };
  const CoordinatorTarget target = security ? security->AdminTarget((*cluster)->address())
                                            : CoordinatorTarget{(*cluster)->address(), {}, "", ""};
  std::string job_name;
  int signal = 0;
  if (spec.has_value()) {
    FlatshardClient client(target);
    absl::StatusOr<v1::Job> job = client.CreateJob(*spec);
    if (job.status().code() == absl::StatusCode::kAlreadyExists) {
      // The state dir brought it back: continue it rather than refuse.
      job = client.GetJob(spec->name());
      if (job.ok()) {
        out << "job '" << spec->name()
            << "' is in the state dir: continuing it (delete it to start over)\n";
      }
    }
    if (!job.ok()) return ReportError("up", job.status(), err);
    // In slices, so that Ctrl-C (blocked for sigwait) is heard meanwhile.
    const absl::Time give_up = absl::Now() + absl::Seconds(120);
    absl::StatusOr<v1::JobState> state;
    do {
      state = client.WaitForState(spec->name(), {v1::READY}, absl::Seconds(1));
      signal = PendingStopSignal();
    } while (signal == 0 && state.status().code() == absl::StatusCode::kDeadlineExceeded &&
             absl::Now() < give_up);
    if (signal != 0) {
      out << "\n" << strsignal(signal) << ": ";
      return StopCluster(prometheus.get(), **cluster, say);
    }
    if (!state.ok()) {
      return ReportError(
          "up",
          absl::Status(
              state.status().code(),
              absl::StrCat("job '", spec->name(), "' is not READY: ", state.status().message(),
                           " (flatshard job status -j ", spec->name(), " says why)")),
          err);
    }
    job_name = spec->name();
    // The step now, not the state dir's: a continued job may have rolled
    // back to its last checkpoint on the way to READY.
    if (absl::StatusOr<v1::Job> ready = client.GetJob(job_name); ready.ok()) job = ready;
    out << "job '" << job_name << "' is READY at step " << job->step() << " (" << job->units_size()
        << " units)\n";
  }
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
        << "   # the admin token of this cluster (audit log: " << security->dir << "/audit.log)\n";
  }
  if (job_name.empty()) {
    out << "  flatshard job create" << c << " -f examples/mlp-job.yaml\n";
    job_name = "mlp-demo";
  }
  out << "  flatshard train" << c << " -j " << job_name << " --steps 50\n"
      << "  flatshard workers" << c << "\n"
      << "  flatshard summon" << c << " -j " << job_name << " --out model.safetensors\n"
      << "Ctrl-C stops the cluster (saving the job first if its newest checkpoint is behind it)."
      << std::endl;

  // As the daemons' supervisor (client/up_supervisor.h) until Ctrl-C or
  // SIGTERM, or until the coordinator is gone for good.
  UpSupervisor supervisor(**cluster, prometheus.get(), out, err);
  while (sigwait(&signals, &signal) == 0 && signal == SIGCHLD) {
    if (!supervisor.OnChildExit()) break;
  }
  out << "\n" << (signal == SIGCHLD ? "the coordinator is gone" : strsignal(signal)) << ": ";
  std::unique_ptr<StopSave> save;
  if ((signal == SIGINT || signal == SIGTERM) && o.stop_save_timeout_s > 0) {
    out << "saving before stopping, if the job's newest checkpoint is behind it" << std::endl;
    save = SaveBeforeStop(target, absl::Seconds(o.stop_save_timeout_s), say);
  }
  const bool waited = save == nullptr || save->phase.load() == StopSave::kDone;
  int code = StopCluster(prometheus.get(), **cluster, say);
  if (signal == SIGCHLD) code = kExitFailed;  // the cluster ended on a failure
  if (save == nullptr) return code;
  save->thread.join();
  if (!waited && save->Kept()) say("(the save finished as the cluster stopped: nothing is lost)");
  // A supervisor (or script) learns that trained steps were lost.
  return save->Kept() ? code : kExitFailed;
}

}  // namespace flatshard
