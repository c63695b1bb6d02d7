// The coordinator's state behind its two services: membership (who is there),
// the rendezvous store, and the job. A monitor thread forms a PENDING job as
// soon as enough live workers have registered, and fails a running job whose
// worker misses heartbeats for longer than the timeout, naming the rank.
// One job at a time (docs/architecture.md §1: a coordinator per training job).
#ifndef FLATSHARD_COORDINATOR_COORDINATOR_H_
#define FLATSHARD_COORDINATOR_COORDINATOR_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "coordinator/kv_store.h"
#include "coordinator/membership.h"
#include "coordinator/state_store.h"
#include "coordinator/training_job.h"
#include "flatshard/v1/job.pb.h"

namespace flatshard {

struct CoordinatorOptions {
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration heartbeat_timeout = absl::Seconds(5);
  TrainingJobOptions job;  // job.connect: GrpcWorkerClient unless a test swaps it
  // Worker ids the membership keeps (their ranks are [0, max_workers)): a
  // holder of the join token cannot grow the table, the state store and
  // every monitor pass without bound.
  int max_workers = 65536;
  // The durable state (--state-dir); null keeps everything in memory. Must
  // outlive the coordinator.
  StateStore* state = nullptr;
};

class Coordinator {
 public:
  explicit Coordinator(CoordinatorOptions options);
  ~Coordinator();  // Shutdown

  // Stops the monitor and the job (cancelling a formation in progress and
  // aborting the workers' collectives), so that the operations the services
  // run return promptly. A CreateJob under way is waited for first (its
  // directory listing and record, as long as the disk takes), and its job
  // stopped too. The state stays readable until destruction, which must
  // come after the gRPC server stopped. Idempotent.
  void Shutdown(const std::string& reason);

  MembershipTable& members() { return members_; }
  KvStore& store() { return store_; }
  const CoordinatorOptions& options() const { return options_; }

  // Loads the workers and the job the state store holds (before Start). A
  // job that had been formed comes back RECOVERING: the monitor re-adopts its
  // workers once they heartbeat again, or rolls it back.
  absl::Status RestoreState();

  // INVALID_ARGUMENT naming the field for a bad spec; ALREADY_EXISTS when a job
  // of that name exists; FAILED_PRECONDITION when another job is running;
  // UNAVAILABLE while another create, a deletion or the shutdown runs.
  absl::StatusOr<v1::Job> CreateJob(const v1::JobSpec& spec);
  // NOT_FOUND naming the job (and the one that exists, if any).
  absl::StatusOr<std::shared_ptr<TrainingJob>> FindJob(const std::string& name) const;
  // UNAVAILABLE once Shutdown began: what the job services answer then
  // (FindJob too), rather than the job stopped in memory.
  absl::Status Serving() const;
  // Stops the job, then removes its record from the state store. When that
  // fails (the database busy or the disk full) the job stays, STOPPED, and
  // the error says so: a restarted coordinator would otherwise bring back a
  // job its user was told is gone. A retry, or creating the next job,
  // finishes the deletion.
  absl::Status DeleteJob(const std::string& name);
  // The job, or null when there is none.
  std::shared_ptr<TrainingJob> current_job() const;
  // The job's rank of `worker_id`, or -1.
  int JobRank(const std::string& worker_id) const;

  std::optional<uint64_t> AbortEpochFor(const std::string& worker_id) const;

  // Starts the monitor thread; Tick runs one pass (what the thread does
  // every half heartbeat interval).
  void Start();
  void Tick(absl::Time now);

 private:
  TrainingJobOptions JobOptions();
  // Removes the record of the deleted job `name` from the state store.
  absl::Status ForgetJobRecord(const std::string& name);
  // UNAVAILABLE while a creation, a deletion or the shutdown runs; mu_ held.
  absl::Status RefuseWhileBusyLocked() const;
  // FindJob with mu_ held.
  absl::StatusOr<std::shared_ptr<TrainingJob>> FindJobLocked(const std::string& name) const;
  absl::Status ServingLocked() const;
  // What callers are told from the start of Shutdown on (UNAVAILABLE).
  static absl::Status ShuttingDownError();
  void MaybeForm(const std::shared_ptr<TrainingJob>& job, absl::Time now);
  void MaybeReadopt(const std::shared_ptr<TrainingJob>& job, absl::Time now);
  void CheckHeartbeats(const std::shared_ptr<TrainingJob>& job, absl::Time now);
  // Members whose registration another daemon process took over: their
  // shards are gone, though their heartbeats never stopped.
  void FailReplacedMembers(const std::shared_ptr<TrainingJob>& job,
                           const std::vector<MembershipTable::Replaced>& replaced);

  CoordinatorOptions options_;
  MembershipTable members_;
  KvStore store_;

  mutable std::mutex mu_;
  std::shared_ptr<TrainingJob> job_;
  std::thread former_;  // forms the job off the monitor thread
  bool forming_ = false;
  absl::Time restored_at_;  // when RestoreState brought a job back
  // The job DeleteJob is deleting now, and the ones whose delete could not
  // remove their record (STOPPED, still job_; the record may still hold the
  // job as it was): the next create removes those first, within its
  // reservation (creating_) and outside mu_, or refuses, since a restart
  // would bring the old job back instead of the new one.
  std::string deleting_;
  std::set<std::string> undeleted_;
  // Deletions RestoreState could not finish: STOPPED records, never
  // restored. The next create tries them too, and refuses only for its own
  // name: its record is written over, not replaced, and would take on the
  // old job's rows (a training operation, the batch journal).
  std::set<std::string> unfinished_deletions_;
  // The job CreateJob is building (outside mu_); reservation_cv_ tells
  // Shutdown when that, and a deletion (deleting_), is over.
  std::string creating_;
  std::condition_variable reservation_cv_;
  bool shutting_down_ = false;  // Shutdown began: the job is stopped in memory only

  std::mutex monitor_mu_;
  std::condition_variable monitor_cv_;
  bool stop_ = false;
  std::thread monitor_;
};

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_COORDINATOR_H_
