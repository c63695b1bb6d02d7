#include "coordinator/coordinator.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

#include "coordinator/failed_rank.h"
#include "core/job_config.h"
#include "core/status_macros.h"

namespace flatshard {

Coordinator::Coordinator(CoordinatorOptions options)
    : options_(std::move(options)), members_(options_.max_workers, options_.heartbeat_timeout) {}

Coordinator::~Coordinator() { Shutdown("the coordinator is shutting down"); }

void Coordinator::Shutdown(const std::string& reason) {
  {
    // From here on the job is stopped in memory only: no create or delete
    // may take that for a deletion. A create under way is let finish, so
    // that the job it makes is the one stopped below; so is a delete, so
    // that its stop persists STOPPED and its watchers see a deletion.
    std::unique_lock<std::mutex> lock(mu_);
    shutting_down_ = true;
    reservation_cv_.wait(lock, [this] { return creating_.empty() && deleting_.empty(); });
  }
  {
    std::lock_guard<std::mutex> lock(monitor_mu_);
    stop_ = true;
  }
  monitor_cv_.notify_all();
  if (monitor_.joinable()) monitor_.join();
  std::shared_ptr<TrainingJob> job;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job = job_;
  }
  if (job != nullptr) {
    // What stopping does (STOPPED, aborted ranks) is this process's end, not
    // the job's: the state store keeps the job as it was for the next start.
    job->StopForShutdown(reason, ShuttingDownError());
  }
  if (former_.joinable()) former_.join();
}

TrainingJobOptions Coordinator::JobOptions() {
  TrainingJobOptions job_options = options_.job;
  // Recovery looks for spares among the workers heartbeating now.
  job_options.live_workers = [this] {
    std::vector<WorkerRecord> live;
    const absl::Time now = absl::Now();
    for (const WorkerRecord& w : members_.List()) {
      if (now - w.last_heartbeat <= options_.heartbeat_timeout) live.push_back(w);
    }
    return live;
  };
  job_options.find_worker = [this](const std::string& id) -> std::optional<WorkerRecord> {
    for (const WorkerRecord& w : members_.List()) {
      if (w.worker_id == id) return w;
    }
    return std::nullopt;
  };
  job_options.mark_unreachable = [this](const WorkerRecord& probed) {
    members_.MarkUnreachable(probed.worker_id, probed.address);
  };
  job_options.rendezvous = &store_;
  job_options.state = options_.state;
  return job_options;
}

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

std::shared_ptr<TrainingJob> Coordinator::current_job() const {
  std::lock_guard<std::mutex> lock(mu_);
  return job_;
}

absl::StatusOr<std::shared_ptr<TrainingJob>> Coordinator::FindJob(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  return FindJobLocked(name);
}

absl::Status Coordinator::Serving() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ServingLocked();
}

absl::Status Coordinator::ShuttingDownError() {
  return absl::UnavailableError(
      "the coordinator is shutting down; its job is kept in its state dir, and a coordinator "
      "started again on it brings the job back");
}

absl::Status Coordinator::ServingLocked() const {
  // The job is stopped in memory only: STOPPED would read as deleted.
  if (!shutting_down_) return absl::OkStatus();
  return ShuttingDownError();
}

absl::StatusOr<std::shared_ptr<TrainingJob>> Coordinator::FindJobLocked(
    const std::string& name) const {
  if (name.empty()) {
    return absl::InvalidArgumentError("job: the job name must not be empty");
  }
  RETURN_IF_ERROR(ServingLocked());
  if (job_ == nullptr || job_->name() != name) {
    return absl::NotFoundError(
        absl::StrCat("no job named '", name, "'",
                     job_ == nullptr ? std::string(" (this coordinator has no job; create one with "
                                                   "`flatshard job create -f JOB.yaml`)")
                                     : absl::StrCat(" (the job here is '", job_->name(), "')")));
  }
  return job_;
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

int Coordinator::JobRank(const std::string& worker_id) const {
  std::shared_ptr<TrainingJob> job;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job = job_;
  }
  if (job == nullptr) return -1;
  const std::vector<std::string> ids = job->worker_ids();
  auto it = std::find(ids.begin(), ids.end(), worker_id);
  return it == ids.end() ? -1 : static_cast<int>(it - ids.begin());
}

std::optional<uint64_t> Coordinator::AbortEpochFor(const std::string& worker_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (job_ == nullptr) return std::nullopt;
  return job_->AbortEpochFor(worker_id);
}

void Coordinator::Start() {
  monitor_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(monitor_mu_);
    while (!stop_) {
      lock.unlock();
      Tick(absl::Now());
      lock.lock();
      monitor_cv_.wait_for(lock, absl::ToChronoMilliseconds(options_.heartbeat_interval / 2),
                           [this] { return stop_; });
    }
  });
}

void Coordinator::Tick(absl::Time now) {
  std::shared_ptr<TrainingJob> job;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job = job_;
  }
  const std::vector<MembershipTable::Replaced> replaced = members_.TakeReplaced();
  if (job == nullptr) return;
  MaybeForm(job, now);
  FailReplacedMembers(job, replaced);
  CheckHeartbeats(job, now);
}

void Coordinator::FailReplacedMembers(const std::shared_ptr<TrainingJob>& job,
                                      const std::vector<MembershipTable::Replaced>& replaced) {
  const std::vector<std::string> ids = job->worker_ids();
  for (const MembershipTable::Replaced& r : replaced) {
    auto it = std::find(ids.begin(), ids.end(), r.worker_id);
    if (it == ids.end()) continue;
    const absl::Status reason = absl::UnavailableError(absl::StrCat(
        "worker ", r.worker_id, " restarted: a new daemon registered at ", r.new_address,
        " in place of the one at ", r.old_address, ", whose shards are gone"));
    if (job->FailRank(static_cast<int>(it - ids.begin()), r.worker_id, reason, r.old_incarnation)) {
      spdlog::error("job '{}': {}", job->name(), std::string(reason.message()));
    }
  }
}

void Coordinator::MaybeReadopt(const std::shared_ptr<TrainingJob>& job, absl::Time now) {
  const std::vector<std::string> ids = job->readoption_pending();
  if (ids.empty() || job->states().state() != v1::RECOVERING) return;
  // Every member of the epoch heartbeating again, or long enough waited for
  // the rest: then Readopt decides (re-adopt, or roll back without them).
  size_t live = 0;
  for (const WorkerRecord& w : members_.List()) {
    if (now - w.last_heartbeat <= options_.heartbeat_timeout &&
        std::find(ids.begin(), ids.end(), w.worker_id) != ids.end()) {
      ++live;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (live < ids.size() && now - restored_at_ < 2 * options_.heartbeat_timeout) return;
  if (forming_) return;
  if (former_.joinable()) former_.join();
  forming_ = true;
  former_ = std::thread([this, job] {
    if (absl::Status status = job->Readopt(); !status.ok()) {
      spdlog::error("job '{}' could not be taken back: {}", job->name(),
                    std::string(status.message()));
    }
    std::lock_guard<std::mutex> done(mu_);
    forming_ = false;
  });
}

void Coordinator::MaybeForm(const std::shared_ptr<TrainingJob>& job, absl::Time now) {
  MaybeReadopt(job, now);
  if (job->states().state() != v1::PENDING) return;
  const JobConfig& config = job->config();
  std::vector<WorkerRecord> live;
  for (const WorkerRecord& w : members_.List()) {
    if (now - w.last_heartbeat <= options_.heartbeat_timeout) live.push_back(w);
  }
  std::vector<WorkerRecord> chosen;
  if (!config.rank_by_worker_id.empty()) {
    chosen.resize(static_cast<size_t>(config.world_size));
    for (const WorkerRecord& w : live) {
      auto it = config.rank_by_worker_id.find(w.worker_id);
      if (it != config.rank_by_worker_id.end()) chosen[static_cast<size_t>(it->second)] = w;
    }
    for (const WorkerRecord& w : chosen) {
      if (w.worker_id.empty()) return;  // someone named in the spec is missing
    }
  } else {
    if (static_cast<int>(live.size()) < config.world_size) return;
    chosen.assign(live.begin(), live.begin() + config.world_size);  // by membership rank
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (forming_) return;
  if (former_.joinable()) former_.join();
  forming_ = true;
  former_ = std::thread([this, job, chosen] {
    absl::Status status = job->Form(chosen);
    if (status.ok()) {
      spdlog::info("job '{}' formed with {} workers", job->name(), chosen.size());
    } else {
      spdlog::error("job '{}' could not be formed: {}", job->name(), std::string(status.message()));
    }
    std::lock_guard<std::mutex> done(mu_);
    forming_ = false;
  });
}

void Coordinator::CheckHeartbeats(const std::shared_ptr<TrainingJob>& job, absl::Time now) {
  const v1::JobState state = job->states().state();
  const bool forming = state == v1::FORMING || state == v1::RECOVERING;
  if (!forming && state != v1::READY && state != v1::TRAINING && state != v1::IDLE) return;
  const std::vector<std::string> ids = job->worker_ids();
  for (const WorkerRecord& stale : members_.Stale(now, options_.heartbeat_timeout)) {
    const absl::Status reason = absl::UnavailableError(
        stale.last_heartbeat == absl::InfinitePast()
            ? absl::StrCat("worker ", stale.worker_id, " at ", stale.address,
                           " has not heartbeat since it was found unreachable")
            : absl::StrCat("worker ", stale.worker_id, " at ", stale.address,
                           " missed heartbeats for ",
                           absl::FormatDuration(
                               absl::Trunc(now - stale.last_heartbeat, absl::Milliseconds(1))),
                           " (timeout ", absl::FormatDuration(options_.heartbeat_timeout), ")"));
    // A worker that stops while being configured holds up every rank's
    // rendezvous; without this the formation waits its configure timeout.
    bool failed = forming && job->FailFormingWorker(stale.worker_id, stale.last_heartbeat,
                                                    options_.heartbeat_timeout, now, reason);
    if (!failed) {
      auto it = std::find(ids.begin(), ids.end(), stale.worker_id);
      if (it == ids.end()) continue;
      failed = job->FailRank(static_cast<int>(it - ids.begin()), stale.worker_id, reason);
    }
    if (failed) {
      spdlog::error("job '{}': {}", job->name(), std::string(reason.message()));
      return;
    }
  }
}

}  // namespace flatshard
