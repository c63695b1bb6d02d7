#include "client/cluster_commands.h"

#include <cstdio>
#include <map>

#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

#include "client/cli_output.h"
#include "client/flatshard_client.h"
#include "core/job_config.h"
#include "core/job_spec_yaml.h"
#include "core/model_spec_proto.h"
#include "core/safetensors.h"
#include "storage/safetensors_file_writer.h"
#include "storage/spec_files.h"

namespace flatshard {
namespace {

std::string StateName(v1::JobState state) { return v1::JobState_Name(state); }

}  // namespace

std::string RecoverySummary(const v1::Recovery& r) {
  return absl::StrFormat(
      "rank(s) %s failed at step %d; re-formed at world size %d%s in %s, resumed at step %d "
      "from %s (%d step(s) lost): %s",
      r.failed_ranks().empty() ? std::string("none") : absl::StrJoin(r.failed_ranks(), ","),
      r.failed_at_step(), r.world_size(), r.spare_used() ? " with a spare" : "",
      FormatSeconds(r.seconds()), r.resumed_step(),
      r.checkpoint().empty() ? std::string("initialization") : "checkpoint " + r.checkpoint(),
      r.steps_lost(), r.cause());
}

namespace {

int MaxRestarts(const v1::JobSpec& spec) {
  return spec.recovery().has_max_restarts() ? spec.recovery().max_restarts()
                                            : RecoverySettings{}.max_restarts;
}

}  // namespace

void ClusterCommands::Add(CLI::App& app) {
  CLI::App* job = app.add_subcommand("job", "Create, inspect and delete the coordinator's job");
  job->require_subcommand(1);
  job_create_ = job->add_subcommand(
      "create",
      "Create a job from a job file (docs/job-spec.md) and wait until its workers are "
      "configured");
  job_create_->add_option("--file,-f", job_file_, "Job file, e.g. examples/mlp-job.yaml")
      ->required()
      ->check(CLI::ExistingFile);
  job_create_->add_option("--name", name_override_, "Use this name instead of the file's");
  job_create_->add_flag("--no-wait", no_wait_, "Return once created, without waiting for READY");
  job_create_->add_option("--timeout", wait_timeout_s_, "Seconds to wait for READY")
      ->capture_default_str();
  job_status_ = job->add_subcommand("status", "Show the job: state, step, units, failure");
  AddJobOption(job_status_, job_);
  job_delete_ = job->add_subcommand("delete", "Stop and delete the job (workers stay up)");
  AddJobOption(job_delete_, job_);

  workers_ = app.add_subcommand("workers", "List the registered workers and their heartbeats");
  workers_->add_option("--job,-j", job_, "Only the workers of this job");

  train_ = app.add_subcommand(
      "train",
      "Train N steps on the coordinator, streaming each step's loss and speed. The training "
      "outlives this command: Ctrl-C asks it to stop after the current step (twice: leave it "
      "running), and a cut stream leaves it running");
  AddJobOption(train_, job_);
  train_->add_option("--steps,-n", steps_, "Optimizer steps to run (not with --attach)");
  train_
      ->add_option("--no-sync-micro-steps", micro_steps_,
                   "Gradient-accumulation micro-steps (no_sync) before each synced step")
      ->capture_default_str();
  train_->add_flag("--attach", attach_,
                   "Follow the training already running on the coordinator, from its current step");
  train_->add_flag("--detach", detach_, "Start the training and return at once; it runs by itself");
  train_->add_option("--log", train_log_,
                     "Also append each step as a JSON line (as --json prints it) to this file");
  job_stop_ = job->add_subcommand("stop", "Ask the job's running training to stop after its step");
  AddJobOption(job_stop_, job_);

  unshard_ = app.add_subcommand(
      "unshard", "All-gather units' full parameters on every rank (until `reshard`)");
  AddJobOption(unshard_, job_);
  unshard_->add_option("--units,-u", units_, "Unit indices (default: every unit)")->delimiter(',');
  reshard_ = app.add_subcommand("reshard", "Free units' full parameters again");
  AddJobOption(reshard_, job_);
  reshard_->add_option("--units,-u", units_, "Unit indices (default: every unit)")->delimiter(',');

  summon_ = app.add_subcommand(
      "summon", "Gather the full parameters (summon_full_params) into a safetensors file");
  AddJobOption(summon_, job_);
  summon_->add_option("--out,-o", out_path_, "Output file, e.g. model.safetensors")->required();
  summon_->add_flag("--with-grads", with_grads_,
                    "Also the gradients, as '<fqn>.grad' (use_orig_params jobs)");
  summon_->add_option("--chunk-bytes", chunk_bytes_, "Stream chunk size (0: 4 MiB)");

  watch_ = app.add_subcommand("watch", "Print the job's state changes as they happen");
  AddJobOption(watch_, job_);

  for (CLI::App* command : {job_create_, job_status_, job_delete_, job_stop_, workers_, train_,
                            unshard_, reshard_, summon_, watch_}) {
    AddCoordinatorOption(command, coordinator_);
    command->add_flag("--json", json_, "Machine-readable output (JSON)");
  }
}

int ClusterCommands::Run(std::ostream& out, std::ostream& err) {
  if (job_create_->parsed()) return JobCreate(out, err);
  if (job_status_->parsed()) return JobStatus(out, err);
  if (job_delete_->parsed()) return JobDelete(out, err);
  if (job_stop_->parsed()) return JobStop(out, err);
  if (workers_->parsed()) return Workers(out, err);
  if (train_->parsed()) return Train(out, err);
  if (unshard_->parsed()) return Unshard(true, out, err);
  if (reshard_->parsed()) return Unshard(false, out, err);
  if (summon_->parsed()) return Summon(out, err);
  if (watch_->parsed()) return Watch(out, err);
  return -1;
}

int ClusterCommands::JobCreate(std::ostream& out, std::ostream& err) {
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecFile(job_file_);
  if (!spec.ok()) return ReportError("job create", spec.status(), err);
  if (!name_override_.empty()) spec->set_name(name_override_);
  FlatshardClient client(coordinator_);
  absl::StatusOr<v1::Job> job = client.CreateJob(*spec);
  if (!job.ok()) return ReportError("job create", job.status(), err);
  if (!json_) {
    out << "job '" << spec->name() << "' created: " << spec->world_size() << " ranks, "
        << job->units_size() << " units\n";
  }
  if (!no_wait_) {
    if (!json_) out << "waiting for " << spec->world_size() << " workers to be configured...\n";
    absl::StatusOr<v1::JobState> state = client.WaitForState(
        spec->name(), {v1::READY, v1::IDLE, v1::TRAINING}, absl::Seconds(wait_timeout_s_));
    if (!state.ok()) return ReportError("job create", state.status(), err);
    job = client.GetJob(spec->name());
    if (!job.ok()) return ReportError("job create", job.status(), err);
  }
  if (json_) {
    out << MessageToJson(*job) << "\n";
  } else {
    out << "job '" << spec->name() << "' is " << StateName(job->state()) << "\n";
    if (job->state() == v1::READY) {
      out << "Next: flatshard train -j " << spec->name() << " --steps 50\n";
    }
  }
  return kExitOk;
}

int ClusterCommands::JobStatus(std::ostream& out, std::ostream& err) {
  FlatshardClient client(coordinator_);
  absl::StatusOr<v1::Job> job = client.GetJob(job_);
  if (!job.ok()) return ReportError("job status", job.status(), err);
  if (json_) {
    out << MessageToJson(*job) << "\n";
    return kExitOk;
  }
  out << "job:        " << job->spec().name() << "\n"
      << "state:      " << StateName(job->state()) << "\n"
      << "world size: " << job->world_size()
      << (job->world_size() != job->spec().world_size()
              ? absl::StrCat(" (the spec's ", job->spec().world_size(), ", shrunk by recovery)")
              : std::string())
      << "\n"
      << "strategy:   " << v1::ShardingStrategy_Name(job->spec().sharding().strategy()) << "\n"
      << "step:       " << job->step() << "\n"
      << "saved as:   "
      << (job->state_checkpoint().empty()
              ? std::string("(no checkpoint holds this state, or it is not known)")
              : absl::StrCat("checkpoint '", job->state_checkpoint(), "'"))
      << "\n"
      << "epoch/seq:  " << job->epoch() << "/" << job->last_seq() << "\n";
  if (!job->failure().empty()) out << "failure:    " << job->failure() << "\n";
  out << "restarts:   " << job->restarts() << " of " << MaxRestarts(job->spec()) << "\n";
  if (job->has_last_recovery()) {
    out << "recovered:  " << RecoverySummary(job->last_recovery()) << "\n";
  }
  if (job->has_training()) out << "training:   " << TrainingSummary(job->training()) << "\n";
  std::vector<std::vector<std::string>> rows;
  for (const v1::Unit& unit : job->units()) {
    rows.push_back({absl::StrCat(unit.index()),
                    unit.module_fqn().empty() ? "(root)" : unit.module_fqn(),
                    absl::StrCat(unit.param_fqns_size()), absl::StrCat(unit.numel())});
  }
  out << "\n";
  PrintTable({"UNIT", "MODULE", "PARAMS", "NUMEL"}, rows, out);
  return kExitOk;
}

int ClusterCommands::JobDelete(std::ostream& out, std::ostream& err) {
  FlatshardClient client(coordinator_);
  if (absl::Status s = client.DeleteJob(job_); !s.ok()) return ReportError("job delete", s, err);
  if (!json_) out << "job '" << job_ << "' deleted\n";
  return kExitOk;
}

int ClusterCommands::Workers(std::ostream& out, std::ostream& err) {
  FlatshardClient client(coordinator_);
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = client.ListWorkers(job_);
  if (!workers.ok()) return ReportError("workers", workers.status(), err);
  if (json_) {
    v1::ListWorkersResponse response;
    for (const v1::WorkerInfo& w : *workers) *response.add_workers() = w;
    out << MessageToJson(response) << "\n";
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const v1::WorkerInfo& w : *workers) {
    // "cuda (NVIDIA H100 80GB HBM3)"; cpu and sim name themselves.
    const std::string device = w.device_name().empty() || w.device_name() == w.device()
                                   ? w.device()
                                   : absl::StrCat(w.device(), " (", w.device_name(), ")");
    rows.push_back({w.rank() < 0 ? "-" : absl::StrCat(w.rank()), w.worker_id(), device, w.address(),
                    w.state(), FormatSeconds(w.heartbeat_age_seconds()),
                    absl::StrCat(w.last_completed_seq()),
                    w.metrics_address().empty() ? "-" : w.metrics_address()});
  }
  PrintTable({"RANK", "WORKER", "DEVICE", "ADDRESS", "STATE", "HEARTBEAT", "LAST-SEQ", "METRICS"},
             rows, out);
  if (workers->empty()) {
    out << "(no workers yet: start them with `flatshard up` or flatshard-worker)\n";
  }
  return kExitOk;
}

int ClusterCommands::Unshard(bool unshard, std::ostream& out, std::ostream& err) {
  const std::string command = unshard ? "unshard" : "reshard";
  FlatshardClient client(coordinator_);
  const absl::Status status = unshard ? client.Unshard(job_, units_) : client.Reshard(job_, units_);
  if (!status.ok()) return ReportError(command, status, err);
  if (!json_) {
    out << command << "ed "
        << (units_.empty() ? "every unit" : "units " + absl::StrJoin(units_, ",")) << " of job '"
        << job_ << "'\n";
  }
  return kExitOk;
}

int ClusterCommands::Summon(std::ostream& out, std::ostream& err) {
  FlatshardClient client(coordinator_);
  std::map<std::string, SafetensorsTensor> tensors;
  int64_t received = 0;
  const bool tty = !json_ && isatty(STDOUT_FILENO) != 0;
  absl::Status status = client.SummonFullParams(
      job_, with_grads_, chunk_bytes_, [&](const v1::TensorChunk& chunk) -> absl::Status {
        SafetensorsTensor& t = tensors[chunk.fqn()];
        if (chunk.offset_bytes() == 0) {
          absl::StatusOr<DType> dtype = DTypeFromProto(chunk.dtype(), DType::kFloat32, "dtype");
          if (!dtype.ok()) return dtype.status();
          t.dtype = *dtype;
          t.shape.assign(chunk.shape().begin(), chunk.shape().end());
          t.data.reserve(static_cast<size_t>(chunk.total_bytes()));
        }
        if (static_cast<int64_t>(t.data.size()) != chunk.offset_bytes()) {
          return absl::DataLossError(absl::StrCat("tensor '", chunk.fqn(), "': chunk at byte ",
                                                  chunk.offset_bytes(), " after ", t.data.size(),
                                                  " bytes"));
        }
        t.data += chunk.data();
        received += static_cast<int64_t>(chunk.data().size());
        if (tty) {
          out << "\rreceived " << tensors.size() << " tensors, "
              << absl::StrFormat("%.1f MiB", static_cast<double>(received) / (1 << 20))
              << std::flush;
        }
        return absl::OkStatus();
      });
  if (tty) out << "\n";
  if (!status.ok()) return ReportError("summon", status, err);
  status = WriteSafetensorsFile(out_path_, tensors, {{"format", "pt"}, {"job", job_}});
  if (!status.ok()) return ReportError("summon", status, err);
  if (json_) {
    out << absl::StrFormat(R"({"path":"%s","tensors":%d,"bytes":%d})", out_path_, tensors.size(),
                           received)
        << "\n";
  } else {
    out << "wrote " << tensors.size() << " tensors ("
        << absl::StrFormat("%.2f MiB", static_cast<double>(received) / (1 << 20)) << ") to "
        << out_path_ << "\n";
  }
  return kExitOk;
}

int ClusterCommands::Watch(std::ostream& out, std::ostream& err) {
  FlatshardClient client(coordinator_);
  absl::Status status = client.WatchEvents(job_, [&](const v1::JobEvent& event) {
    if (json_) {
      out << MessageToJson(event) << std::endl;
    } else {
      out << absl::FormatTime("%H:%M:%S", absl::FromUnixMicros(event.unix_micros()),
                              absl::LocalTimeZone())
          << "  " << StateName(event.state()) << "  " << event.message() << std::endl;
    }
    return true;
  });
  if (!status.ok()) return ReportError("watch", status, err);
  return kExitOk;
}

}  // namespace flatshard
