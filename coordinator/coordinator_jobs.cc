// The coordinator's job records (docs/fault-tolerance.md, "The coordinator
// fails": "Restart" and "Deleting a job"): the job brought back from the
// state dir at start, a job created, a job deleted, and the records a delete
// or a start could not remove, which the next create removes first. One job at a time;
// a create or a delete is reserved under mu_ and runs its disk work outside
// it, so heartbeats and other calls are answered meanwhile.
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

#include "coordinator/coordinator.h"
#include "core/job_config.h"
#include "core/status_macros.h"
#include "core/status_payloads.h"

namespace flatshard {

absl::Status Coordinator::RestoreState() {
  StateStore* state = options_.state;
  if (state == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::vector<WorkerRecord> workers, state->LoadWorkers());
  members_.Restore(workers, absl::Now());
  members_.set_on_register([state](const WorkerRecord& w) {
    if (absl::Status s = state->PutWorker(w); !s.ok()) {
      spdlog::error("worker {}: {}", w.worker_id, std::string(s.message()));
    }
  });
  ASSIGN_OR_RETURN(std::vector<JobRecord> jobs, state->LoadJobs());
  for (const JobRecord& record : jobs) {
    const std::string& name = record.spec.name();
    if (record.state == v1::STOPPED) {
      // Only a deletion persists STOPPED (a coordinator's own shutdown keeps
      // the record as it was): this one was cut short. It is finished now,
      // or by the next create (CreateJob), as a delete refused by the store.
      if (ForgetJobRecord(name).ok()) {
        spdlog::warn(
            "state dir {}: job '{}' was being deleted when the coordinator stopped; "
            "deleted now",
            state->dir(), name);
      } else {
        std::lock_guard<std::mutex> lock(mu_);
        unfinished_deletions_.insert(name);
      }
      continue;  // not restored either way
    }
    if (job_ != nullptr) {
      spdlog::warn("state dir {} also holds job '{}'; this coordinator runs one job ('{}')",
                   state->dir(), name, job_->name());
      continue;
    }
    ASSIGN_OR_RETURN(std::optional<BatchRecord> last_batch, state->LoadLastBatch(name));
    ASSIGN_OR_RETURN(std::optional<v1::TrainingOperation> training, state->LoadOperation(name));
    absl::StatusOr<std::unique_ptr<TrainingJob>> job =
        TrainingJob::Restore(record, last_batch, training, JobOptions());
    if (!job.ok()) {
      return absl::Status(job.status().code(),
                          absl::StrCat("state dir ", state->dir(), ": job '", name,
                                       "' cannot be restored: ", job.status().message()));
    }
    std::lock_guard<std::mutex> lock(mu_);
    job_ = *std::move(job);
    restored_at_ = absl::Now();
    for (const std::string& partial : job_->checkpoints().RemoveStalePartials()) {
      spdlog::warn(
          "job '{}': removed {}.partial, a checkpoint save that never committed or a retired one "
          "not yet removed",
          name, partial);
    }
    spdlog::info("job '{}' restored from {}: {} at step {}, epoch {}", name, state->dir(),
                 v1::JobState_Name(job_->states().state()), record.step, record.epoch);
  }
  spdlog::info("state dir {}: {} worker(s), {} job(s)", state->dir(), workers.size(), jobs.size());
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> Coordinator::CreateJob(const v1::JobSpec& spec) {
  ASSIGN_OR_RETURN(JobConfig config, JobConfigFromProto(spec));
  std::set<std::string> undeleted, unfinished;  // records that stayed: removed first
  {
    std::lock_guard<std::mutex> lock(mu_);
    RETURN_IF_ERROR(RefuseWhileBusyLocked());
    if (job_ != nullptr && job_->states().state() != v1::STOPPED) {
      if (job_->name() == config.name) {
        return absl::AlreadyExistsError(absl::StrCat("job '", config.name, "' already exists (",
                                                     v1::JobState_Name(job_->states().state()),
                                                     "); delete it first or pick another name"));
      }
      return absl::FailedPreconditionError(
          absl::StrCat("this coordinator runs one job at a time and job '", job_->name(),
                       "' exists; delete it first (flatshard job delete ", job_->name(), ")"));
    }
    undeleted = undeleted_;
    unfinished = unfinished_deletions_;
    // Rendezvous keys an earlier job of this name left would hand its peers'
    // dead addresses to the new epoch 1.
    store_.DeletePrefix(absl::StrCat("job/", config.name));
    creating_ = config.name;
  }
  // The reservation ends on every way out, or every later create and
  // delete would be refused, and a shutdown wait, for good.
  absl::Cleanup reserved = [this] {
    std::lock_guard<std::mutex> lock(mu_);
    creating_.clear();
    reservation_cv_.notify_all();
  };
  for (const std::string& old : undeleted) {
    // That record goes before this job writes its own, or a restarted
    // coordinator would bring the old job back instead of this one. The
    // store may wait out another holder of its lock: outside mu_, and
    // creating_ keeps every delete (of the old job too) out meanwhile.
    if (absl::Status s = ForgetJobRecord(old); !s.ok()) {
      return PrefixStatus(absl::StrCat("job '", config.name, "' was not created: job '", old,
                                       "' was deleted but kept its record: "),
                          s);
    }
    std::lock_guard<std::mutex> lock(mu_);
    undeleted_.erase(old);
  }
  for (const std::string& old : unfinished) {
    // A STOPPED record a restart would not restore: in the way only of a job
    // of its own name (ForgetJobRecord logs the others' failures).
    if (absl::Status s = ForgetJobRecord(old); !s.ok()) {
      if (old != config.name) continue;
      return PrefixStatus(absl::StrCat("job '", config.name, "' was not created: the record of ",
                                       "a deleted job of that name is still there: "),
                          s);
    }
    std::lock_guard<std::mutex> lock(mu_);
    unfinished_deletions_.erase(old);
  }
  // Building the job lists its checkpoint directory (where its history
  // starts), writes its record and clears the partial saves it finds: as
  // long as the disk takes, so outside mu_, which every heartbeat and every
  // job call takes. creating_ keeps every other create and delete out.
  const std::string name = config.name;
  absl::StatusOr<std::unique_ptr<TrainingJob>> job =
      TrainingJob::Create(spec, std::move(config), JobOptions());
  if (!job.ok()) return job.status();
  for (const std::string& partial : (*job)->checkpoints().RemoveStalePartials()) {
    spdlog::warn(
        "job '{}': removed {}.partial, a checkpoint save that never committed or a retired one "
        "not yet removed",
        name, partial);
  }
  std::shared_ptr<TrainingJob> replaced;  // the STOPPED one before: let go after mu_
  std::lock_guard<std::mutex> lock(mu_);
  // In place before the reservation ends (the cleanup, after this lock): a
  // shutdown waiting for the creation finds this job to stop.
  replaced = std::exchange(job_, *std::move(job));
  spdlog::info("job '{}' created: world size {}, {} units", name, job_->config().world_size,
               job_->ToProto().units_size());
  monitor_cv_.notify_all();
  return job_->ToProto();
}

absl::Status Coordinator::DeleteJob(const std::string& name) {
  std::shared_ptr<TrainingJob> job;
  {
    // Found and reserved in one hold of mu_: a job created again under this
    // name in between would otherwise lose its record to this deletion.
    // Busy first: a coordinator busy creating or deleting a job says so to
    // any delete, of a job it has or not.
    std::lock_guard<std::mutex> lock(mu_);
    RETURN_IF_ERROR(RefuseWhileBusyLocked());
    ASSIGN_OR_RETURN(job, FindJobLocked(name));
    deleting_ = name;
  }
  // STOPPED is persisted (when the store takes it): a crash between this and
  // the record's removal leaves a deletion the next start finishes.
  job->Stop("deleted");
  store_.DeletePrefix(absl::StrCat("job/", name));
  const absl::Status forgotten = ForgetJobRecord(name);
  std::lock_guard<std::mutex> lock(mu_);
  deleting_.clear();
  reservation_cv_.notify_all();  // a shutdown waits for the deletion
  if (!forgotten.ok()) {
    undeleted_.insert(name);
    return PrefixStatus(
        absl::StrCat("job '", name,
                     "' is stopped but not deleted, and a restarted coordinator would bring it "
                     "back; retry `flatshard job delete ",
                     name, "`: "),
        forgotten);
  }
  undeleted_.erase(name);
  if (job_ == job) job_ = nullptr;
  spdlog::info("job '{}' deleted", name);
  return absl::OkStatus();
}

absl::Status Coordinator::RefuseWhileBusyLocked() const {
  if (shutting_down_) return absl::UnavailableError("the coordinator is shutting down");
  if (!deleting_.empty()) {
    return absl::UnavailableError(
        absl::StrCat("job '", deleting_, "' is being deleted; try again once it is"));
  }
  if (!creating_.empty()) {
    return absl::UnavailableError(
        absl::StrCat("job '", creating_, "' is being created; try again once it is"));
  }
  return absl::OkStatus();
}

absl::Status Coordinator::ForgetJobRecord(const std::string& name) {
  if (options_.state == nullptr) return absl::OkStatus();
  absl::Status s = options_.state->DeleteJob(name);
  if (!s.ok()) {
    spdlog::error("job '{}': its record in the state store could not be removed: {}", name,
                  std::string(s.message()));
  }
  return s;
}

}  // namespace flatshard
