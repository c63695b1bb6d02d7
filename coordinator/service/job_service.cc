#include "coordinator/service/job_service.h"

#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

#include "coordinator/service/stalled_write_guard.h"
#include "core/job_config.h"
#include "core/job_spec_yaml.h"
#include "core/plan.h"
#include "proto/grpc_status.h"

namespace flatshard {
namespace {

// The plan JSON lists every rank's slice of every parameter: one request for a
// big model at a huge world size would cost the coordinator gigabytes (the
// GPT example at 65,536 ranks: 1.3 GB, 5.7 s; 140 bytes of JSON per slice).
// Such plans are for `flatshard
// plan`, offline.
constexpr int64_t kMaxPlanRankSlices = int64_t{1} << 18;

int64_t CountParams(const ModuleSpec& module) {
  int64_t n = static_cast<int64_t>(module.params.size());
  for (const ModuleSpec& child : module.children) n += CountParams(child);
  return n;
}

}  // namespace

grpc::Status JobServiceImpl::CreateJob(grpc::ServerContext*, const v1::CreateJobRequest* request,
                                       v1::CreateJobResponse* response) {
  absl::StatusOr<v1::JobSpec> spec = RequestedJobSpec(*request);
  if (!spec.ok()) return ToGrpcStatus(spec.status());
  absl::StatusOr<v1::Job> job = coordinator_->CreateJob(*spec);
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response->mutable_job() = *std::move(job);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext*, const v1::GetJobRequest* request,
                                    v1::GetJobResponse* response) {
  absl::StatusOr<std::shared_ptr<TrainingJob>> job = coordinator_->FindJob(request->name());
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response->mutable_job() = (*job)->ToProto();
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*,
                                      v1::ListJobsResponse* response) {
  if (absl::Status serving = coordinator_->Serving(); !serving.ok()) {
    return ToGrpcStatus(serving);
  }
  if (std::shared_ptr<TrainingJob> job = coordinator_->current_job()) {
    *response->add_jobs() = job->ToProto();
  }
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::DeleteJob(grpc::ServerContext*, const v1::DeleteJobRequest* request,
                                       v1::DeleteJobResponse*) {
  return ToGrpcStatus(coordinator_->DeleteJob(request->name()));
}

grpc::Status JobServiceImpl::Plan(grpc::ServerContext*, const v1::PlanRequest* request,
                                  v1::PlanResponse* response) {
  absl::StatusOr<v1::JobSpec> spec = RequestedJobSpec(*request);
  if (!spec.ok()) return ToGrpcStatus(spec.status());
  absl::StatusOr<JobConfig> config = JobConfigFromProto(*spec);
  if (!config.ok()) return ToGrpcStatus(config.status());
  const int64_t slices = CountParams(config->model.root) * config->world_size;
  if (slices > kMaxPlanRankSlices) {
    return ToGrpcStatus(absl::ResourceExhaustedError(absl::StrCat(
        "plan: world_size ", config->world_size, " x ", CountParams(config->model.root),
        " parameters is ", slices, " rank slices; the limit plan_rank_slices is ",
        kMaxPlanRankSlices, " (run `flatshard plan` offline for such plans)")));
  }
  absl::StatusOr<flatshard::Plan> plan = ComputePlan(
      config->model, config->wrap_policy, config->world_size, config->sharding, config->optimizer);
  if (!plan.ok()) return ToGrpcStatus(plan.status());
  response->set_plan_json(PlanToJson(*plan));
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ListWorkers(grpc::ServerContext*,
                                         const v1::ListWorkersRequest* request,
                                         v1::ListWorkersResponse* response) {
  if (!request->job().empty()) {
    absl::StatusOr<std::shared_ptr<TrainingJob>> job = coordinator_->FindJob(request->job());
    if (!job.ok()) return ToGrpcStatus(job.status());
  }
  const absl::Time now = absl::Now();
  for (const WorkerRecord& w : coordinator_->members().List()) {
    const int rank = coordinator_->JobRank(w.worker_id);
    if (!request->job().empty() && rank < 0) continue;
    v1::WorkerInfo* info = response->add_workers();
    info->set_worker_id(w.worker_id);
    info->set_rank(rank);
    info->set_host(w.host);
    info->set_device(w.device);
    info->set_device_name(w.device_name);
    info->set_address(w.address);
    info->set_metrics_address(w.metrics_address);
    info->set_state(w.state.empty() ? "registered" : w.state);
    info->set_heartbeat_age_seconds(absl::ToDoubleSeconds(now - w.last_heartbeat));
    info->set_last_completed_seq(w.last_completed_seq);
  }
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::Train(grpc::ServerContext* context, const v1::TrainRequest* request,
                                   grpc::ServerWriter<v1::StepResult>* writer) {
  absl::StatusOr<std::shared_ptr<TrainingJob>> job = coordinator_->FindJob(request->job());
  if (!job.ok()) return ToGrpcStatus(job.status());
  if (request->attach() && request->detach()) {
    return ToGrpcStatus(absl::InvalidArgumentError("train: attach and detach exclude each other"));
  }
  std::shared_ptr<TrainingRun> run;
  uint64_t cursor = 0;
  if (request->attach()) {
    run = (*job)->training();
    if (run == nullptr || !run->operation().running()) {
      return ToGrpcStatus(absl::FailedPreconditionError(absl::StrCat(
          "job '", request->job(), "' is not training; start with `flatshard train -j ",
          request->job(), " --steps N`")));
    }
    cursor = run->published();  // from the current step on
  } else {
    // The caller's words, shown in logs, events and refusals to other
    // clients: escaped, so a newline cannot forge a log line, and capped.
    constexpr size_t kMaxStartedByBytes = 256;
    const std::string started_by =
        request->started_by().empty()
            ? context->peer()
            : absl::CHexEscape(
                  absl::string_view(request->started_by()).substr(0, kMaxStartedByBytes));
    absl::StatusOr<std::shared_ptr<TrainingRun>> started =
        (*job)->StartTraining(request->steps(), request->no_sync_micro_steps(), started_by);
    if (!started.ok()) return ToGrpcStatus(started.status());
    run = *std::move(started);
    if (request->detach()) return grpc::Status::OK;
  }
  // Stream until the operation ends; a client that goes away (or stops
  // reading) leaves it running.
  StalledWriteGuard guard(context, options_.stalled_write_timeout, "Train");
  while (true) {
    TrainingRun::Results next = run->Next(cursor, absl::Now() + absl::Seconds(1));
    for (const v1::StepResult& result : next.results) {
      if (context->IsCancelled() || !guard.Write(writer, result)) {
        return grpc::Status(grpc::StatusCode::CANCELLED,
                            "the client went away; the training goes on");
      }
    }
    cursor = next.next;
    if (next.finished) return ToGrpcStatus(next.status);
    if (context->IsCancelled()) {
      return grpc::Status(grpc::StatusCode::CANCELLED,
                          "the client went away; the training goes on");
    }
  }
}

grpc::Status JobServiceImpl::StopTraining(grpc::ServerContext*,
                                          const v1::StopTrainingRequest* request,
                                          v1::StopTrainingResponse* response) {
  absl::StatusOr<std::shared_ptr<TrainingJob>> job = coordinator_->FindJob(request->job());
  if (!job.ok()) return ToGrpcStatus(job.status());
  absl::StatusOr<int64_t> step = (*job)->StopTraining();
  if (!step.ok()) return ToGrpcStatus(step.status());
  response->set_was_running(true);
  response->set_step(*step);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::Unshard(grpc::ServerContext*, const v1::UnshardRequest* request,
                                     v1::UnshardResponse*) {
  absl::StatusOr<std::shared_ptr<TrainingJob>> job = coordinator_->FindJob(request->job());
  if (!job.ok()) return ToGrpcStatus(job.status());
  return ToGrpcStatus((*job)->Unshard(
      std::vector<int>(request->unit_indices().begin(), request->unit_indices().end())));
}

grpc::Status JobServiceImpl::Reshard(grpc::ServerContext*, const v1::ReshardRequest* request,
                                     v1::ReshardResponse*) {
  absl::StatusOr<std::shared_ptr<TrainingJob>> job = coordinator_->FindJob(request->job());
  if (!job.ok()) return ToGrpcStatus(job.status());
  return ToGrpcStatus((*job)->Reshard(
      std::vector<int>(request->unit_indices().begin(), request->unit_indices().end())));
}

grpc::Status JobServiceImpl::SummonFullParams(grpc::ServerContext* context,
                                              const v1::SummonFullParamsRequest* request,
                                              grpc::ServerWriter<v1::TensorChunk>* writer) {
  absl::StatusOr<std::shared_ptr<TrainingJob>> job = coordinator_->FindJob(request->job());
  if (!job.ok()) return ToGrpcStatus(job.status());
  // The job's operation slot is held while this streams: a client that stops
  // reading is cut off after the stalled-write timeout, not when its
  // connection happens to die.
  StalledWriteGuard guard(context, options_.stalled_write_timeout, "SummonFullParams");
  return ToGrpcStatus((*job)->Summon(
      request->with_grads(), request->chunk_bytes(), [&](const v1::TensorChunk& chunk) {
        if (context->IsCancelled() || !guard.Write(writer, chunk)) {
          return absl::CancelledError(guard.cancelled()
                                          ? "the client read nothing for the stalled-write timeout"
                                          : "the client stopped reading");
        }
        return absl::OkStatus();
      }));
}

grpc::Status JobServiceImpl::SetStateDictSettings(grpc::ServerContext*,
                                                  const v1::SetStateDictSettingsRequest* request,
                                                  v1::SetStateDictSettingsResponse* response) {
  absl::StatusOr<std::shared_ptr<TrainingJob>> job = coordinator_->FindJob(request->job());
  if (!job.ok()) return ToGrpcStatus(job.status());
  const v1::StateDictSettings& settings = request->settings();
  if (!v1::StateDictType_IsValid(settings.state_dict_type())) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("settings.state_dict_type has unknown value ", settings.state_dict_type())));
  }
  const bool full = settings.state_dict_type() == v1::FULL_STATE_DICT ||
                    settings.state_dict_type() == v1::STATE_DICT_TYPE_UNSPECIFIED;
  for (const auto& [field, config] :
       {std::pair{"state_dict_config", &settings.state_dict_config()},
        std::pair{"optim_state_dict_config", &settings.optim_state_dict_config()}}) {
    if (!full && config->rank0_only()) {
      return ToGrpcStatus(absl::InvalidArgumentError(
          absl::StrCat("settings.", field, ".rank0_only applies to FULL_STATE_DICT only, not ",
                       v1::StateDictType_Name(settings.state_dict_type()))));
    }
  }
  *response->mutable_previous() = (*job)->SetStateDictSettings(settings);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::WatchEvents(grpc::ServerContext* context,
                                         const v1::WatchEventsRequest* request,
                                         grpc::ServerWriter<v1::JobEvent>* writer) {
  absl::StatusOr<std::shared_ptr<TrainingJob>> job = coordinator_->FindJob(request->job());
  if (!job.ok()) return ToGrpcStatus(job.status());
  JobStateMachine& states = (*job)->states();
  StalledWriteGuard guard(context, options_.stalled_write_timeout, "WatchEvents");
  size_t next = 0;
  // Wake up now and then to notice a client that went away.
  while (!context->IsCancelled()) {
    bool closed = false;
    const std::vector<JobEventRecord> events =
        states.EventsFrom(next, absl::Now() + absl::Milliseconds(500), &closed);
    for (const JobEventRecord& e : events) {
      v1::JobEvent event;
      event.set_job(request->job());
      event.set_state(e.state);
      event.set_message(e.message);
      event.set_unix_micros(absl::ToUnixMicros(e.time));
      if (!guard.Write(writer, event)) return grpc::Status::OK;
    }
    next += events.size();
    // Every event was sent (closed and nothing new in the same look): a
    // deleted job's watch ends OK after STOPPED, a shutting-down
    // coordinator's UNAVAILABLE (its job is not deleted).
    if (events.empty() && closed) return ToGrpcStatus(states.end());
  }
  return grpc::Status::OK;
}

namespace {

v1::CheckpointProgress Progress(const v1::CheckpointInfo& info, const std::string& manifest) {
  v1::CheckpointProgress progress;
  progress.set_name(info.name());
  progress.set_bytes_written(info.bytes());
  progress.set_bytes_total(info.bytes());
  progress.set_done(true);
  progress.set_manifest_path(manifest);
  progress.set_step(info.step());
  return progress;
}

}  // namespace

grpc::Status JobServiceImpl::SaveCheckpoint(grpc::ServerContext*,
                                            const v1::SaveCheckpointRequest* request,
                                            grpc::ServerWriter<v1::CheckpointProgress>* writer) {
  absl::StatusOr<std::shared_ptr<TrainingJob>> job = coordinator_->FindJob(request->job());
  if (!job.ok()) return ToGrpcStatus(job.status());
  std::optional<v1::StateDictSettings> settings;
  if (request->has_settings()) settings = request->settings();
  absl::StatusOr<v1::CheckpointInfo> info =
      (*job)->SaveCheckpoint(request->name(), settings, request->async_save(), [&] {
        // Training may go on now; the files are being written in the background.
        v1::CheckpointProgress snapshot;
        snapshot.set_name(request->name());
        snapshot.set_done(false);
        writer->Write(snapshot);
      });
  if (!info.ok()) return ToGrpcStatus(info.status());
  writer->Write(Progress(*info, absl::StrCat((*job)->checkpoints().job_dir(), "/", info->name(),
                                             "/", kManifestFileName)));
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::LoadCheckpoint(grpc::ServerContext*,
                                            const v1::LoadCheckpointRequest* request,
                                            grpc::ServerWriter<v1::CheckpointProgress>* writer) {
  absl::StatusOr<std::shared_ptr<TrainingJob>> job = coordinator_->FindJob(request->job());
  if (!job.ok()) return ToGrpcStatus(job.status());
  if (request->name().empty()) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        "name is empty: give a checkpoint name or \"latest\" (see `flatshard ckpt ls`)"));
  }
  absl::StatusOr<v1::CheckpointInfo> info = (*job)->LoadCheckpoint(request->name());
  if (!info.ok()) return ToGrpcStatus(info.status());
  writer->Write(Progress(*info, absl::StrCat((*job)->checkpoints().job_dir(), "/", info->name(),
                                             "/", kManifestFileName)));
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ListCheckpoints(grpc::ServerContext*,
                                             const v1::ListCheckpointsRequest* request,
                                             v1::ListCheckpointsResponse* response) {
  absl::StatusOr<std::shared_ptr<TrainingJob>> job = coordinator_->FindJob(request->job());
  if (!job.ok()) return ToGrpcStatus(job.status());
  absl::StatusOr<std::vector<v1::CheckpointInfo>> all = (*job)->ListCheckpoints();
  if (!all.ok()) return ToGrpcStatus(all.status());
  for (v1::CheckpointInfo& info : *all) *response->add_checkpoints() = std::move(info);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::DeleteCheckpoint(grpc::ServerContext*,
                                              const v1::DeleteCheckpointRequest* request,
                                              v1::DeleteCheckpointResponse*) {
  absl::StatusOr<std::shared_ptr<TrainingJob>> job = coordinator_->FindJob(request->job());
  if (!job.ok()) return ToGrpcStatus(job.status());
  if (absl::Status valid = ValidateCheckpointName(request->name()); !valid.ok()) {
    return ToGrpcStatus(valid);
  }
  return ToGrpcStatus((*job)->checkpoints().Delete(request->name()));
}

}  // namespace flatshard
