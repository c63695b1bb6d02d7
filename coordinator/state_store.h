// The coordinator's durable state (docs/fault-tolerance.md §"Coordinator
// restart"): one SQLite database in WAL mode under --state-dir. It holds what
// a restarted coordinator needs to find its job again: the job (spec, state,
// epoch, step, data position, restarts, members by rank, the checkpoint its
// ranks' state is and their checkpoint history), the registered workers, the
// committed checkpoints (the manifests on disk stay the source of truth for
// their contents), the last command batch sent to each job's ranks (written
// before it is sent, so a restart can tell whether it ran), and the training
// operation in progress.
//
// State transitions are committed with synchronous=FULL (fsynced before the
// call returns); each batch's journal entry (with the step and data position
// after it) and progress (at most once a second while training) with
// synchronous=NORMAL, which survives the process being killed at any moment
// (the WAL is in the page cache) but may lose the last steps on power loss: a
// restart then finds the workers ahead of the database and rolls back to the
// last checkpoint, never forward.
//
// A directory lock keeps a second coordinator off the same state dir. The
// schema has a version (PRAGMA user_version) and forward migrations; a state
// dir written by a newer flatshard is refused. Thread-safe.
#ifndef FLATSHARD_COORDINATOR_STATE_STORE_H_
#define FLATSHARD_COORDINATOR_STATE_STORE_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "coordinator/checkpoint_history.h"
#include "coordinator/membership.h"
#include "flatshard/v1/job.pb.h"
#include "flatshard/v1/worker.pb.h"

struct sqlite3;

namespace flatshard {

class SqliteStatement;
class SqliteStatementCache;

// A job as the coordinator last saw it.
struct JobRecord {
  v1::JobSpec spec;
  v1::JobState state = v1::PENDING;
  std::string failure;
  uint64_t epoch = 0;
  int64_t step = 0;
  int64_t data_position = 0;
  uint64_t last_seq = 0;  // of `epoch`
  int restarts = 0;
  int world_size = 0;                   // of `epoch`
  std::vector<std::string> worker_ids;  // of `epoch`, by rank
  std::optional<v1::Recovery> last_recovery;
  // v1::Job::state_checkpoint: the checkpoint the ranks' state is ("" when
  // not known).
  std::string state_checkpoint;
  CheckpointHistory history;  // the ranks' (what a recovery restores from)
};

// The last batch the sequencer sent, with what the job's progress is once it
// has run on every rank.
struct BatchRecord {
  v1::CommandBatch batch;  // stamped: epoch, seq, digest
  int64_t step_after = 0;
  int64_t data_position_after = 0;
  // Sent while the ranks held gradients of the step's earlier no_sync
  // micro-batches (the batch before it, in its epoch, was one).
  bool mid_step_before = false;
  // A step batch written while the step batch before it (seq - 1) ran
  // (TrainingJob::JournalAhead): that one may not have reached every rank.
  // Then `previous_mid_step_before` is that one's mid_step_before.
  bool written_ahead = false;
  bool previous_mid_step_before = false;
};

class StateStore {
 public:
  static constexpr int kSchemaVersion = 6;

  // Creates `dir` if needed and opens (or creates) its database.
  // FAILED_PRECONDITION when another process holds the directory, or when its
  // schema is newer than this build reads; the message names the directory.
  static absl::StatusOr<std::unique_ptr<StateStore>> Open(const std::string& dir);
  ~StateStore();
  StateStore(const StateStore&) = delete;
  StateStore& operator=(const StateStore&) = delete;

  const std::string& dir() const { return dir_; }
  int schema_version() const;

  // Jobs. PutJob replaces the row (durably: a state transition).
  absl::Status PutJob(const JobRecord& job);
  // The checkpoint the ranks' state is, once a save committed (not fsynced).
  absl::Status PutStateCheckpoint(const std::string& job, const std::string& checkpoint);
  // Progress only (step, data position, last seq): not fsynced.
  absl::Status PutProgress(const std::string& job, int64_t step, int64_t data_position,
                           uint64_t last_seq);
  absl::Status DeleteJob(const std::string& job);  // and everything it owns
  absl::StatusOr<std::vector<JobRecord>> LoadJobs() const;

  // The last batch sent to the job's ranks, written before it is sent; with
  // `clears_state_checkpoint` (a batch that changes the ranks' state) the
  // job's state checkpoint is cleared in the same transaction.
  absl::Status PutLastBatch(const std::string& job, const BatchRecord& batch,
                            bool clears_state_checkpoint = false);
  absl::StatusOr<std::optional<BatchRecord>> LoadLastBatch(const std::string& job) const;

  // The training operation in progress (none after it ended).
  absl::Status PutOperation(const std::string& job, const std::optional<v1::TrainingOperation>& op);
  absl::StatusOr<std::optional<v1::TrainingOperation>> LoadOperation(const std::string& job) const;

  // Registered workers.
  absl::Status PutWorker(const WorkerRecord& worker);
  absl::StatusOr<std::vector<WorkerRecord>> LoadWorkers() const;

  // The job's committed checkpoints, as the catalog lists them after a commit,
  // delete or retirement.
  absl::Status PutCheckpoints(const std::string& job,
                              const std::vector<v1::CheckpointInfo>& checkpoints);
  absl::StatusOr<std::vector<v1::CheckpointInfo>> LoadCheckpoints(const std::string& job) const;

 private:
  StateStore(std::string dir, sqlite3* db, int lock_fd);
  absl::Status Migrate();
  // Runs `sql` (no results) on the connection; the caller holds mu_.
  absl::Status ExecLocked(const std::string& sql);
  // `sql` prepared once for the connection's life; the caller holds mu_.
  SqliteStatement StatementLocked(const char* sql) const;
  // How the next commits reach the disk: kFull fsyncs a commit before it
  // returns (state transitions), kNormal leaves it in the page cache (the
  // per-step journal and progress). Set only when it changes, so a training
  // step's commit runs no PRAGMA; the caller holds mu_.
  enum class Synchronous { kUnknown, kNormal, kFull };
  absl::Status SynchronousLocked(Synchronous mode);
  // Commits the open transaction when `body` (its statements) succeeded,
  // rolls it back otherwise; the first failure. The caller holds mu_.
  absl::Status EndTransactionLocked(const absl::Status& body);

  const std::string dir_;
  mutable std::mutex mu_;
  sqlite3* db_;
  // Finalized before db_ is closed (the destructor resets it first).
  std::unique_ptr<SqliteStatementCache> statements_;
  Synchronous synchronous_ = Synchronous::kUnknown;
  int lock_fd_;
};

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_STATE_STORE_H_
