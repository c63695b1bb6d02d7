#include "coordinator/coordinator.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

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
