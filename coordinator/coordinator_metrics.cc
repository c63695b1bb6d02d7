#include "coordinator/coordinator_metrics.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "metrics/duration_buckets.h"
#include "rpc/command_batch.h"

#include "coordinator/coordinator.h"

namespace flatshard {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Labels;

constexpr v1::StateDictType kStateDictTypes[] = {v1::FULL_STATE_DICT, v1::SHARDED_STATE_DICT,
                                                 v1::LOCAL_STATE_DICT};
constexpr const char* kBatchKinds[] = {"step", "micro_step", "control", "checkpoint"};

// The `kind` label of a batch's round trip: the batch's kind, with no_sync
// micro-steps apart from the steps that synchronize gradients.
std::string BatchKindLabel(const v1::CommandBatch& batch) {
  if (batch.kind_case() == v1::CommandBatch::kStep && !batch.step().sync_gradients()) {
    return "micro_step";
  }
  return std::string(BatchKindName(batch.kind_case()));
}

// "full", "sharded", "local".
std::string TypeLabel(v1::StateDictType type) {
  if (type == v1::STATE_DICT_TYPE_UNSPECIFIED) type = v1::FULL_STATE_DICT;
  std::string name = v1::StateDictType_Name(type);
  name = name.substr(0, name.find('_'));
  return absl::AsciiStrToLower(name);
}

Labels Job(const std::string& job) { return {{"job_name", job}}; }
Labels JobType(const std::string& job, v1::StateDictType type) {
  return {{"job_name", job}, {"type", TypeLabel(type)}};
}

}  // namespace

CoordinatorMetrics::CoordinatorMetrics(prometheus::Registry& registry)
    : steps_(BuildCounter()
                 .Name("flatshard_steps_total")
                 .Help("Optimizer steps the job completed on every rank")
                 .Register(registry)),
      step_seconds_(BuildHistogram()
                        .Name("flatshard_step_duration_seconds")
                        .Help("Wall time of one optimizer step through the coordinator "
                              "(its no_sync micro-steps included)")
                        .Register(registry)),
      samples_(BuildCounter()
                   .Name("flatshard_samples_total")
                   .Help("Samples trained on, across all ranks")
                   .Register(registry)),
      samples_per_second_(BuildGauge()
                              .Name("flatshard_samples_per_second")
                              .Help("Throughput of the last step, across all ranks")
                              .Register(registry)),
      loss_(BuildGauge()
                .Name("flatshard_loss")
                .Help("Mean loss over the ranks in the last step")
                .Register(registry)),
      rank_loss_(BuildGauge()
                     .Name("flatshard_rank_loss")
                     .Help("Each rank's mean loss on its local batches in the last step "
                           "(micro-steps averaged)")
                     .Register(registry)),
      grad_norm_(BuildGauge()
                     .Name("flatshard_grad_norm")
                     .Help("Total gradient norm before clipping in the last step (-1: the job "
                           "does not clip)")
                     .Register(registry)),
      step_(BuildGauge()
                .Name("flatshard_job_step")
                .Help("Optimizer steps completed (the step a checkpoint would record)")
                .Register(registry)),
      compute_seconds_(BuildCounter()
                           .Name("flatshard_step_compute_seconds_total")
                           .Help("Step time the slowest rank spent computing")
                           .Register(registry)),
      exposed_comm_seconds_(BuildCounter()
                                .Name("flatshard_step_exposed_comm_seconds_total")
                                .Help("Step time the slowest rank waited for communication")
                                .Register(registry)),
      batch_seconds_(BuildHistogram()
                         .Name("flatshard_batch_round_trip_seconds")
                         .Help("Fan-out of one command batch to every rank until the last "
                               "result, by kind (step, micro_step, control, checkpoint)")
                         .Register(registry)),
      checkpoints_(BuildCounter()
                       .Name("flatshard_checkpoints_total")
                       .Help("Checkpoints saved and committed, by state-dict type")
                       .Register(registry)),
      checkpoint_failures_(BuildCounter()
                               .Name("flatshard_checkpoint_failures_total")
                               .Help("Checkpoint saves that failed (nothing was committed)")
                               .Register(registry)),
      checkpoint_bytes_(BuildCounter()
                            .Name("flatshard_checkpoint_bytes_total")
                            .Help("Bytes of committed checkpoint files")
                            .Register(registry)),
      checkpoint_seconds_(BuildHistogram()
                              .Name("flatshard_checkpoint_duration_seconds")
                              .Help("Time from a save's start to its commit (async saves: "
                                    "the background write included)")
                              .Register(registry)),
      checkpoint_last_success_(BuildGauge()
                                   .Name("flatshard_checkpoint_last_success_timestamp_seconds")
                                   .Help("Unix time of the job's last committed checkpoint")
                                   .Register(registry)),
      restarts_(BuildCounter()
                    .Name("flatshard_job_restarts_total")
                    .Help("Automatic recoveries from a failed rank")
                    .Register(registry)),
      recovery_seconds_(BuildHistogram()
                            .Name("flatshard_job_recovery_duration_seconds")
                            .Help("From a rank's failure to the job ready again (probe, spare "
                                  "wait, re-form, checkpoint restore)")
                            .Register(registry)),
      steps_lost_(BuildCounter()
                      .Name("flatshard_job_steps_lost_total")
                      .Help("Optimizer steps redone because a recovery rewound to a checkpoint")
                      .Register(registry)) {}

void CoordinatorMetrics::OnJobCreated(const std::string& job) {
  // Every series a dashboard or alert reads exists from the start, at zero.
  steps_.Add(Job(job));
  step_seconds_.Add(Job(job), DurationBuckets());
  restarts_.Add(Job(job));
  recovery_seconds_.Add(Job(job), DurationBuckets());
  steps_lost_.Add(Job(job));
  samples_.Add(Job(job));
  compute_seconds_.Add(Job(job));
  exposed_comm_seconds_.Add(Job(job));
  for (const char* kind : kBatchKinds) {
    batch_seconds_.Add({{"job_name", job}, {"kind", kind}}, DurationBuckets());
  }
  for (v1::StateDictType type : kStateDictTypes) {
    checkpoints_.Add(JobType(job, type));
    checkpoint_failures_.Add(JobType(job, type));
    checkpoint_bytes_.Add(JobType(job, type));
    checkpoint_seconds_.Add(JobType(job, type), DurationBuckets());
  }
  std::lock_guard<std::mutex> lock(mu_);
  // A job re-created under an old name starts afresh.
  created_[job] = absl::Now();
  last_save_.erase(job);
}

void CoordinatorMetrics::OnStep(const std::string& job, const v1::StepResult& step,
                                int64_t samples) {
  steps_.Add(Job(job)).Increment();
  step_seconds_.Add(Job(job), DurationBuckets()).Observe(step.step_seconds());
  samples_.Add(Job(job)).Increment(static_cast<double>(samples));
  samples_per_second_.Add(Job(job)).Set(step.samples_per_second());
  loss_.Add(Job(job)).Set(step.loss());
  for (int r = 0; r < step.rank_losses_size(); ++r) {
    rank_loss_.Add({{"job_name", job}, {"rank", absl::StrCat(r)}}).Set(step.rank_losses(r));
  }
  grad_norm_.Add(Job(job)).Set(step.grad_norm());
  step_.Add(Job(job)).Set(static_cast<double>(step.step()));
  compute_seconds_.Add(Job(job)).Increment(std::max(0.0, step.compute_seconds()));
  exposed_comm_seconds_.Add(Job(job)).Increment(std::max(0.0, step.exposed_comm_seconds()));
}

void CoordinatorMetrics::OnBatch(const std::string& job, const v1::CommandBatch& batch,
                                 absl::Duration round_trip) {
  batch_seconds_.Add({{"job_name", job}, {"kind", BatchKindLabel(batch)}}, DurationBuckets())
      .Observe(absl::ToDoubleSeconds(round_trip));
}

void CoordinatorMetrics::OnCheckpointSave(const std::string& job, v1::StateDictType type,
                                          absl::Duration duration,
                                          const absl::StatusOr<v1::CheckpointInfo>& outcome) {
  if (!outcome.ok()) {
    checkpoint_failures_.Add(JobType(job, type)).Increment();
    return;
  }
  checkpoints_.Add(JobType(job, type)).Increment();
  checkpoint_bytes_.Add(JobType(job, type)).Increment(static_cast<double>(outcome->bytes()));
  checkpoint_seconds_.Add(JobType(job, type), DurationBuckets())
      .Observe(absl::ToDoubleSeconds(duration));
  const absl::Time now = absl::Now();
  checkpoint_last_success_.Add(Job(job)).Set(absl::ToDoubleSeconds(now - absl::UnixEpoch()));
  std::lock_guard<std::mutex> lock(mu_);
  last_save_[job] = now;
}

void CoordinatorMetrics::OnRecovery(const std::string& job, const v1::Recovery& recovery) {
  restarts_.Add(Job(job)).Increment();
  recovery_seconds_.Add(Job(job), DurationBuckets()).Observe(recovery.seconds());
  steps_lost_.Add(Job(job)).Increment(
      static_cast<double>(std::max<int64_t>(0, recovery.steps_lost())));
}

void CoordinatorMetrics::AddScrapeGauges(Coordinator& coordinator, absl::Time now,
                                         ScrapedGauges& gauges) const {
  const absl::Duration timeout = coordinator.options().heartbeat_timeout;
  const std::vector<WorkerRecord> workers = coordinator.members().List();
  int up = 0;
  std::map<std::string, const WorkerRecord*> by_id;
  for (const WorkerRecord& w : workers) {
    up += now - w.last_heartbeat <= timeout ? 1 : 0;
    by_id[w.worker_id] = &w;
  }
  gauges.Add("flatshard_workers_registered", "Worker daemons registered with the coordinator", {},
             static_cast<double>(workers.size()));
  gauges.Add("flatshard_workers_up", "Registered workers heartbeating within the timeout", {}, up);

  std::shared_ptr<TrainingJob> job = coordinator.current_job();
  if (job == nullptr) return;
  const std::string& name = job->name();
  const v1::JobState state = job->states().state();
  for (int s = v1::PENDING; s <= v1::RECOVERING; ++s) {
    gauges.Add("flatshard_job_state", "1 for the state the job is in, 0 for the others",
               {{"job_name", name}, {"state", v1::JobState_Name(static_cast<v1::JobState>(s))}},
               s == state ? 1 : 0);
  }
  gauges.Add("flatshard_job_world_size",
             "Ranks the job runs on (fewer than its spec after a "
             "recovery shrank it)",
             Job(name), job->world_size());
  // Per rank of the job as formed (the rank its worker runs as), so these
  // agree with the workers' own series; spare or dropped registrations are
  // not part of the job and are only counted above.
  const std::vector<std::string> ids = job->worker_ids();
  for (size_t r = 0; r < ids.size(); ++r) {
    const auto it = by_id.find(ids[r]);
    if (it == by_id.end()) continue;
    const WorkerRecord& w = *it->second;
    const Labels rank{{"job_name", name}, {"rank", absl::StrCat(r)}};
    const absl::Duration age = now - w.last_heartbeat;
    gauges.Add("flatshard_worker_up",
               "1 while the worker at this rank heartbeats within the timeout, else 0", rank,
               age <= timeout ? 1 : 0);
    gauges.Add("flatshard_worker_heartbeat_age_seconds",
               "Time since the coordinator last heard from the worker at this rank", rank,
               absl::ToDoubleSeconds(age));
    gauges.Add("flatshard_worker_last_completed_seq",
               "Seq of the last command batch the worker at this rank reported completed in "
               "the job's current epoch",
               rank, static_cast<double>(w.last_completed_seq));
  }
  std::lock_guard<std::mutex> lock(mu_);
  const auto saved = last_save_.find(name);
  const auto created = created_.find(name);
  if (saved != last_save_.end() || created != created_.end()) {
    const absl::Time since = saved != last_save_.end() ? saved->second : created->second;
    gauges.Add("flatshard_checkpoint_age_seconds",
               "Time since the job's last committed checkpoint (since the job was created "
               "while it has none)",
               Job(name), absl::ToDoubleSeconds(now - since));
  }
}

}  // namespace flatshard
