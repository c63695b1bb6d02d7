// One job on the coordinator: its validated config and units, its lifecycle
// (JobStateMachine), and, once formed, a WorkerClient per rank and the
// CommandSequencer of the current epoch. Operations (Train, Unshard, Reshard,
// Summon) run one at a time; a second one while another runs is refused with
// FAILED_PRECONDITION rather than queued behind a long Train.
#ifndef FLATSHARD_COORDINATOR_TRAINING_JOB_H_
#define FLATSHARD_COORDINATOR_TRAINING_JOB_H_

#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "coordinator/checkpoint_catalog.h"
#include "coordinator/checkpoint_history.h"
#include "coordinator/command_sequencer.h"
#include "coordinator/job_state_machine.h"
#include "coordinator/link_failures.h"
#include "coordinator/membership.h"
#include "coordinator/peer_snapshot_plan.h"
#include "coordinator/state_store.h"
#include "coordinator/training_job_options.h"
#include "coordinator/training_run.h"
#include "coordinator/worker_client.h"
#include "core/job_config.h"
#include "core/step_program.h"
#include "flatshard/v1/job.pb.h"

namespace flatshard {

struct RecoveryCandidates;  // recovery_plan.h

// FAILED_PRECONDITION naming the workers by device kind when `members` mix kinds.
absl::Status CheckOneDeviceKind(const std::vector<WorkerRecord>& members);

class TrainingJob {
 public:
  // `config` is JobConfigFromProto(spec).
  static absl::StatusOr<std::unique_ptr<TrainingJob>> Create(const v1::JobSpec& spec,
                                                             JobConfig config,
                                                             TrainingJobOptions options);
  // A job a restarted coordinator found in its state store, with the last
  // batch it had sent. A job that was formed comes back RECOVERING, waiting
  // for Readopt; a FAILED one stays FAILED; one never formed is PENDING.
  static absl::StatusOr<std::unique_ptr<TrainingJob>> Restore(
      const JobRecord& record, const std::optional<BatchRecord>& last_batch,
      const std::optional<v1::TrainingOperation>& training, TrainingJobOptions options);
  ~TrainingJob();

  const std::string& name() const { return config_.name; }
  const JobConfig& config() const { return config_; }
  JobStateMachine& states() { return states_; }
  v1::Job ToProto() const;

  // Configures `members` (members[r] becomes rank r) as a new epoch:
  // FORMING, then READY, or FAILED naming the rank that could not configure.
  absl::Status Form(const std::vector<WorkerRecord>& members);
  // Ranks of the current epoch (the spec's world size until a recovery shrank it).
  int world_size() const;

  // Runs `steps` optimizer steps (each after `micro_steps` no_sync micro-steps),
  // calling `on_step` after each; `on_step` returning false (the client went
  // away) stops after that step.
  // `on_started` runs once the job is TRAINING (the operation slot is taken),
  // `on_ended` just before it goes IDLE (reached its target, stopped, or a
  // scheduled checkpoint failed), with the status Train returns then.
  using EndedHook = std::function<void(const absl::Status&, const std::string& outcome)>;
  absl::Status Train(int64_t steps, int micro_steps,
                     const std::function<bool(const v1::StepResult&)>& on_step,
                     const std::function<void()>& on_started = {}, const EndedHook& on_ended = {});

  // The training operation (training_job_train.cc): Train on a thread of the
  // job's, to step() + `steps`, kept in the state dir until it ends. Returns
  // once the job is TRAINING, or why it could not start (FAILED_PRECONDITION
  // naming the training already running).
  absl::StatusOr<std::shared_ptr<TrainingRun>> StartTraining(int64_t steps, int micro_steps,
                                                             const std::string& started_by);
  // The running or last training operation (null before the first).
  std::shared_ptr<TrainingRun> training() const;
  // Asks the running training to end after its current step; the job's step
  // now. FAILED_PRECONDITION when none runs.
  absl::StatusOr<int64_t> StopTraining();
  absl::Status Unshard(const std::vector<int>& units);  // empty: every unit
  absl::Status Reshard(const std::vector<int>& units);
  absl::Status Summon(bool with_grads, int64_t chunk_bytes, const WorkerClient::ChunkSink& sink);
  v1::StateDictSettings SetStateDictSettings(const v1::StateDictSettings& settings);

  // Saves checkpoint `name` ("" names it step-<step>) with `settings` (unset:
  // the job's). While Train runs, the save runs between two of its steps and
  // this call waits for it, so a second client can checkpoint a job that
  // another client is training. With `async_save` the ranks only snapshot
  // their files to host memory before training may go on (`on_snapshot` is
  // called then); the files are written and the checkpoint committed in the
  // background, and this call returns when it is committed.
  absl::StatusOr<v1::CheckpointInfo> SaveCheckpoint(
      const std::string& name, const std::optional<v1::StateDictSettings>& settings,
      bool async_save = false, const std::function<void()>& on_snapshot = {});
  // Loads a committed checkpoint ("latest" resolves the pointer): every rank
  // stages it (reads and validates, changing nothing), and only when all did
  // is it applied; training then resumes at its step and data position.
  absl::StatusOr<v1::CheckpointInfo> LoadCheckpoint(const std::string& name);
  CheckpointCatalog& checkpoints() { return catalog_; }
  // The committed checkpoints, oldest first, the one a recovery at the
  // current world size would restore marked (recovery_target).
  absl::StatusOr<std::vector<v1::CheckpointInfo>> ListCheckpoints() const;
  // Automatic recoveries so far, and the last one (unset before the first).
  int restarts() const;
  std::optional<v1::Recovery> last_recovery() const;

  // The heartbeat monitor's verdict: fails the batch in flight. The operation
  // that ran it recovers (Train goes on); with no operation running, recovery
  // runs on a thread of its own. Without restarts left the job is FAILED.
  // While RECOVERING or FORMING it fails only the batches of an epoch a
  // recovery formed (its restore), and the recovery tries again. False when
  // there was nothing to fail (`worker_id` no longer holds `rank`, or no
  // live epoch). With `incarnation`, only an epoch seated with that daemon
  // process under the id (not one formed since with its successor).
  bool FailRank(int rank, const std::string& worker_id, const absl::Status& reason,
                const std::string& incarnation = "");
  // The heartbeat monitor's verdict while the job is FORMING or RECOVERING:
  // when `worker_id` is being configured, that formation fails now, naming it
  // (rather than at the configure timeout). True when it was.
  // `silent_since`: its last heartbeat; it must have been silent for
  // `timeout` since the formation began.
  bool FailFormingWorker(const std::string& worker_id, absl::Time silent_since,
                         absl::Duration timeout, absl::Time now, const absl::Status& reason);
  // Stops the job for good (deleted): aborts the workers' collectives and
  // waits for a recovery in progress to give up.
  void Stop(const std::string& reason);
  // Stops the job in memory only (the coordinator is shutting down): nothing
  // more reaches the state store, and a watch ends with `watchers_end`
  // rather than with a STOPPED event that would read as a deletion.
  void StopForShutdown(const std::string& reason, const absl::Status& watchers_end);

  // Restored jobs (training_job_state.cc): the workers of the epoch the
  // restarted coordinator found (empty when there is nothing to re-adopt).
  std::vector<std::string> readoption_pending() const;
  // With every rank reporting the epoch and the same last completed seq, and
  // that seq the last batch sent or the one before it, takes the workers back
  // as they are: READY at the step they reached, nothing lost or repeated.
  // Otherwise rolls back: recovers from the last committed checkpoint (a new
  // epoch), saying why in the job's events. Either way, a training operation
  // that was running goes on to its target step.
  absl::Status Readopt();

  // The epoch `worker_id` must abort, if the job failed while it was in it.
  std::optional<uint64_t> AbortEpochFor(const std::string& worker_id) const;
  // Worker ids by rank (empty before the first formation).
  std::vector<std::string> worker_ids() const;

 private:
  TrainingJob(const v1::JobSpec& spec, JobConfig config, ModelIndex index, std::vector<Unit> units,
              TrainingJobOptions options);
  // The job, laid out, with no history and nothing persisted: Create starts
  // both for a new job, Restore takes them from the record.
  static absl::StatusOr<std::unique_ptr<TrainingJob>> Build(const v1::JobSpec& spec,
                                                            JobConfig config,
                                                            TrainingJobOptions options);

  // Takes the operation slot, or explains why not (state, busy).
  // A job READY or IDLE whose slot is held is usually finishing something
  // that already said so (a training's last saves after IDLE, a recovery,
  // re-adoption or growth after READY): the call waits up to 5 s for the slot
  // before it is refused. A TRAINING job refuses at once.
  using OperationLock = std::unique_lock<std::timed_mutex>;
  absl::StatusOr<OperationLock> BeginOperation(const char* what);
  // Whether `worker`'s current registration failed to join this job
  // (refused_joiners_); takes mu_.
  bool RefusedToJoin(const WorkerRecord& worker) const;
  // Passes `worker`'s current registration over from now on (it broke a
  // formation or the first batches of an epoch it joined, `why`); takes mu_.
  void RefuseJoiner(const WorkerRecord& worker, absl::string_view why);
  // The worker (id) of the current epoch's rank that `failure` is blamed on
  // (FailedRank), or empty. Takes mu_.
  std::string BlamedMember(const absl::Status& failure) const;
  // Records that `what` holds the operation slot now; mu_ held.
  void NoteOperationLocked(const char* what);
  // Why no operation may start in `state` (OK when one may): what is named.
  absl::Status RefuseOperationIn(v1::JobState state, const char* what) const;
  absl::StatusOr<std::vector<int>> CheckUnits(const std::vector<int>& units) const;
  absl::Status RunControl(const StepProgram& commands);
  void FailWith(const absl::Status& status);
  // Form's work with the operation slot held, at the world size of `config`.
  // On failure `*blamed` (when given) names the workers blamed for it: the
  // one whose own failure ended the formation, the ends of a link that
  // failed once too often (LinkFailures), or none (the job was stopped).
  absl::Status FormLocked(const std::vector<WorkerRecord>& members, const v1::JobSpec& spec,
                          std::shared_ptr<const JobConfig> config,
                          std::vector<std::string>* blamed = nullptr);
  // Ends the formation in progress for `why` (the first cause stands): its
  // rendezvous is abandoned, so the ranks waiting there are free at once, and
  // the clients whose Configure calls to cancel are returned (none if the
  // formation had ended already). `rank`: whose failure it is, or -1. mu_
  // held; the caller cancels after releasing it (CancelFormation): a
  // cancelled call's answer can run on the cancelling thread, and a
  // formation's answers take mu_.
  [[nodiscard]] std::vector<std::shared_ptr<WorkerClient>> AbandonFormationLocked(
      int rank, const absl::Status& why);
  static void CancelFormation(const std::vector<std::shared_ptr<WorkerClient>>& clients);

  // Recovery (training_job_recovery.cc), with the operation slot held: after
  // `cause` failed a batch, re-forms (spares, else a smaller world) and
  // restores the checkpoint RecoveryCheckpoint chooses. OK when the job is
  // READY again; otherwise the job is FAILED and the status says why.
  absl::Status RecoverLocked(const absl::Status& cause, std::vector<int> failed_ranks);
  // Whether a failed try may be followed by another: never (final), within
  // recovery.max_restarts, or without spending one (a failed link forgiven
  // by LinkFailures: the try blamed no one and cost nothing of the job's).
  enum class Retry { kNo, kCounted, kFree };
  // One try of it; `*retry` says what may follow its failure. A spare that
  // fails the try's Configure or restore is refused (RefuseJoiner).
  absl::Status RecoverOnce(const absl::Status& cause, std::vector<int> failed_ranks, Retry* retry);
  // A batch failed under an operation: recovers when the policy allows, and
  // returns the status the operation ends with (OK: recovered, go on).
  absl::Status OnBatchFailure(const absl::Status& cause);
  // Probes (training_job_probe.cc). The live members of the failed epoch, by
  // rank (asked GetStatus); returns the ranks that did not answer.
  std::vector<int> ProbeMembers(
      std::vector<WorkerRecord>* alive,
      std::map<std::string, std::vector<v1::PeerSnapshotHeld>>* held = nullptr);
  // Members that did not answer (`lost`, by rank) but are among `live` again
  // (a partition healed, a daemon restarted under its id), on the job's kind
  // of device: each is asked, in parallel, at the address it heartbeats
  // from, and one that answers, its aborted work let go, leaves `lost` for
  // the candidates' survivors (kept in rank order). One that does not is
  // marked unreachable: asked again after its next heartbeat. Nothing is
  // asked from `until` on, nor is a verdict awaited past it. Returns the ids
  // readmitted.
  std::vector<std::string> ReadmitReturning(
      const std::vector<WorkerRecord>& live, absl::Time until, std::map<int, WorkerRecord>* lost,
      RecoveryCandidates* candidates,
      std::map<std::string, std::vector<v1::PeerSnapshotHeld>>* held);
  // Survivors no longer among `live` as they were probed (gone, or
  // restarted under their id) go back to `lost`, by rank.
  void ForgetGoneSurvivors(const std::vector<WorkerRecord>& live, std::map<int, WorkerRecord>* lost,
                           RecoveryCandidates* candidates);
  // A recovery's wait for seats (training_job_probe.cc): fills the
  // candidates' spares (live workers outside `old_ids`), readmitting
  // returning members as it goes, until they fill the world size, or
  // spare_wait_s has passed and they can re-form, or min_world_wait_s has
  // too. CANCELLED when the job is being stopped.
  absl::Status AwaitSeats(absl::Time began, const std::set<std::string>& old_ids,
                          std::map<int, WorkerRecord>* lost, RecoveryCandidates* candidates,
                          std::map<std::string, std::vector<v1::PeerSnapshotHeld>>* held,
                          std::set<std::string>* readmitted);
  // The checkpoint a recovery at `world_size` restores: the newest of the
  // ranks' history that world can load (ChooseRecoveryCheckpoint).
  std::optional<v1::CheckpointInfo> RecoveryCheckpoint(int world_size) const;
  // The same among `committed` (the catalog's list, oldest first).
  std::optional<v1::CheckpointInfo> RecoveryCheckpointOf(
      const std::vector<v1::CheckpointInfo>& committed, int world_size) const;
  // Growing back (training_job_growth.cc). Between steps of Train, after a
  // scheduled checkpoint: a job a recovery shrank grows back to its spec's
  // world size when enough workers are live again (a new epoch, the
  // checkpoint of this step loaded, nothing lost). OK also when it does not
  // grow; the job is then still TRAINING, else READY.
  absl::Status MaybeGrow();

  // In-memory peer snapshots (training_job_snapshots.cc): after every K-th
  // step (checkpoints.in_memory_every_steps) every rank takes one; a non-OK
  // status is a failed batch. A restore returns false when the snapshots
  // could not rebuild the state (the job is unchanged: use a checkpoint).
  absl::Status MaybeTakePeerSnapshot();
  absl::StatusOr<bool> RestorePeerSnapshotLocked(const PeerSnapshotChoice& choice);

  // The state store (training_job_state.cc): the whole record after every
  // transition, progress at most once a second, the write-ahead batch journal.
  void Persist();
  void PersistProgress();
  // From now on nothing is written to the state store (StopForShutdown).
  void DetachState();
  void JournalBatch(const v1::CommandBatch& batch);
  // Journals `next`, the step batch after `sent` (a step batch the ranks are
  // running), as JournalBatch will record it once `sent` ran everywhere;
  // JournalBatch then finds it written. A restarted coordinator that finds
  // the ranks one seq short of it takes it as a batch that ran nowhere.
  void JournalAhead(const v1::CommandBatch& sent, v1::CommandBatch next);
  // A save committed as `checkpoint` from a snapshot taken at `generation`:
  // it is the state, and is stored as it, unless the state changed since.
  void NameTheState(const std::string& checkpoint, uint64_t generation);
  void WatchState();  // installs the hooks above
  // Readopt's first half: every rank's report agrees with the state store.
  // The progress the ranks are at; an error saying why not.
  struct Progress {
    int64_t step = 0;
    int64_t data_position = 0;
    uint64_t last_seq = 0;
  };
  absl::StatusOr<Progress> AgreedProgress(const std::vector<WorkerRecord>& members);
  absl::Status ReadoptLocked();  // Readopt with the operation slot

  // The training operation's thread body, its launch, and its record.
  absl::StatusOr<std::shared_ptr<TrainingRun>> LaunchRun(const v1::TrainingOperation& op);
  void RunTraining(const std::shared_ptr<TrainingRun>& run);
  void SaveOperation(const std::optional<v1::TrainingOperation>& op);
  void ResumeTraining();  // the restored operation, if any

  // Checkpoints (training_job_checkpoints.cc; loads, training_job_load.cc).
  struct PendingSave;
  v1::StateDictType ResolveStateDictType(
      const std::optional<v1::StateDictSettings>& settings) const;
  using SaveFuture = std::shared_future<absl::StatusOr<v1::CheckpointInfo>>;
  // Runs a save's collectives now (the operation slot is held). Synchronous:
  // also writes and commits; the future is ready. Async: the ranks snapshot,
  // and the background committer awaits their writes and commits.
  SaveFuture StartSave(const std::string& name, v1::StateDictType type, bool scheduled,
                       bool async_save);
  absl::StatusOr<v1::CheckpointInfo> SaveNow(const std::string& name, v1::StateDictType type,
                                             bool scheduled = false) {
    return StartSave(name, type, scheduled, false).get();
  }
  // An async save whose ranks took their snapshots and write them now.
  struct AsyncSave {
    std::string name;
    std::string directory;   // the partial directory, as the ranks write into it
    uint64_t batch_seq = 0;  // the save batch's: the ranks' outcomes carry it
    CheckpointManifest manifest;
    absl::Status refused;  // a rank's refusal of the save batch (the others write on)
    std::vector<std::shared_ptr<WorkerClient>> workers;  // the save's epoch's, by rank
    std::vector<std::string> ids;                        // their worker ids
    std::shared_ptr<CommandSequencer> seq;               // the save's epoch's
    // Commits the manifest with the files written; reports any other outcome.
    std::function<absl::StatusOr<v1::CheckpointInfo>(CheckpointManifest,
                                                     const std::vector<v1::CommandResult>&)>
        commit;
    std::function<absl::StatusOr<v1::CheckpointInfo>(absl::StatusOr<v1::CheckpointInfo>)> report;
  };
  // The committer's work (training_job_async_commit.cc): awaits every rank's
  // write, failing a rank whose write stalls, then commits or abandons.
  absl::StatusOr<v1::CheckpointInfo> CollectAsyncSave(AsyncSave save);
  // Runs a checkpoint batch; per-rank checkpoint errors come back as a status
  // naming the rank, a failed batch also fails the job.
  absl::StatusOr<std::vector<v1::CommandResult>> RunCheckpointBatch(
      const v1::CheckpointBatch& command);
  // Between steps of Train: the saves other clients asked for, and the
  // scheduled one. With `refuse` set they fail with it instead. `last`: Train
  // is ending; saves that arrive from then on take the operation slot
  // themselves.
  void RunPendingSaves(const absl::Status& refuse, bool last);
  absl::Status MaybeScheduledSave();
  // The name of an unnamed save at `step`: step-N, or where another history
  // took it, step-N-2, -3, ...; the one of them this very state was saved
  // as (a save refused as taken, a scheduled one skipped).
  std::string StepCheckpointName(int64_t step) const;
  int64_t StepNow() const;  // step_, under mu_
  // A client's load starts a new history (CheckpointHistory); a recovery's
  // or grow-back's stays on the one it restores from.
  absl::StatusOr<v1::CheckpointInfo> LoadLocked(const std::string& name, bool starts_history);
  absl::Time CheckpointClock() const;  // options_.checkpoint_clock, else absl::Now
  // When a history that starts now begins (CheckpointHistory::since_unix_micros).
  absl::StatusOr<int64_t> HistoryStart() const;
  // Everything but the files, as the job stands now.
  CheckpointManifest BuildManifest(const std::string& name, v1::StateDictType type,
                                   bool scheduled) const;
  std::shared_ptr<CommandSequencer> sequencer() const;
  // A sequencer over clients_ for `epoch`, with the metrics observer and the
  // batch journal; mu_ held.
  std::unique_ptr<CommandSequencer> MakeSequencerLocked(uint64_t epoch);

  v1::JobSpec spec_;
  const JobConfig config_;  // as created; epoch_config_ holds the current world size
  const ModelIndex index_;
  const std::vector<Unit> units_;
  const TrainingJobOptions options_;
  JobStateMachine states_;

  std::timed_mutex op_mu_;  // one operation at a time
  mutable std::mutex mu_;   // guards everything below
  // What took the operation slot last, and when: while the slot is held, the
  // operation that holds it (a refusal names it).
  const char* op_what_ = "";
  absl::Time op_since_;
  uint64_t epoch_ = 0;
  uint64_t oldest_rendezvous_epoch_ = 1;  // the oldest epoch whose store keys may remain
  int64_t step_ = 0;                      // optimizer steps completed
  int64_t data_position_ = 0;             // global batches consumed (micro-steps included)
  // v1::Job::state_checkpoint, persisted (jobs.state_checkpoint): cleared
  // in the store with the batch that changes the state, before it is sent.
  std::string state_checkpoint_;
  // Where a recovery restores from (RecoveryCheckpoint); set by a client's load.
  CheckpointHistory history_;
  // Of the last manifest built (BuildManifest, const: it only orders them).
  mutable int64_t last_created_unix_micros_ = 0;
  // Bumped by everything that may change the ranks' state (a formation, a
  // batch that steps, loads or restores): a save whose snapshot was taken
  // at another generation is not the state now.
  uint64_t state_generation_ = 0;
  std::vector<std::string> worker_ids_;
  // Shared: an async save's committer keeps the clients of its epoch alive
  // while a recovery replaces them.
  std::vector<std::shared_ptr<WorkerClient>> clients_;
  // FormLocked's epoch while its Configure calls run (prefix empty otherwise).
  struct Formation {
    std::string prefix;            // the epoch's rendezvous keys
    std::vector<std::string> ids;  // worker ids by rank
    std::vector<std::shared_ptr<WorkerClient>> clients;
    absl::Time started;
    absl::Status failure;  // the first cause that ended it
    int failed_rank = -1;
  };
  Formation forming_;
  std::shared_ptr<CommandSequencer> sequencer_;  // shared with an async save's committer
  std::set<int> unsharded_;                      // units a manual Unshard left unsharded
  bool training_ = false;                        // Train holds the operation slot
  std::vector<std::shared_ptr<PendingSave>> pending_saves_;
  std::shared_ptr<const JobConfig> epoch_config_;  // the current epoch's (world size)
  std::vector<WorkerRecord> members_;              // the current epoch's, by rank
  int restarts_ = 0;
  std::optional<v1::Recovery> last_recovery_;
  PeerSnapshotMarks peer_marks_;  // the peer snapshots every rank took, newest last
  bool recovering_ = false;       // RecoverLocked runs (a failure inside it is final)
  // Newcomers (spares a recovery took, workers the job grew back onto) whose
  // Configure or restore failed, with the registration (session) that
  // failed: growing and recoveries pass them over until they register again
  // (a restarted daemon, say once its node is fixed), so that one broken node
  // cannot spend a restart at every try or checkpoint.
  std::map<std::string, std::string> refused_joiners_;
  LinkFailures link_failures_;     // the formations' failed connections
  bool recovery_pending_ = false;  // recoverer_ has not finished
  std::thread recoverer_;          // recovers a failure FailRank saw outside operations
  // A failure FailRank saw while recoverer_ was pending, and the epoch it
  // failed: recoverer_ takes it up next (it may be past its own epoch's
  // check, or recovering an older epoch), so that none is dropped.
  struct SeenFailure {
    absl::Status cause;
    uint64_t epoch = 0;
  };
  std::optional<SeenFailure> next_failure_;
  bool stopping_ = false;  // Stop or the destructor: no more recoveries

  // A restored job waiting to be re-adopted.
  struct Restored {
    JobRecord record;
    std::optional<BatchRecord> last_batch;
    bool adoptable = true;  // false: it was mid-formation or mid-recovery
  };
  std::optional<Restored> restored_;
  std::optional<v1::TrainingOperation> resume_;  // restored, started once READY

  std::shared_ptr<TrainingRun> run_;  // the running or last training operation
  std::thread trainer_;               // runs run_; joined by the next one, Stop, ~

  std::mutex persist_mu_;  // one writer at a time, so the last write is the newest state
  StateStore* state_store_ = nullptr;  // guarded by persist_mu_; null once detached
  absl::Time last_progress_persisted_ = absl::InfinitePast();  // guarded by persist_mu_
  // The store may name a state checkpoint (a write of one was tried and no
  // clear has committed since); guarded by persist_mu_.
  bool stored_state_checkpoint_ = false;
  // The epoch whose last journaled batch was a no_sync micro-batch (0: none);
  // guarded by mu_ (JournalBatch).
  uint64_t journaled_micro_epoch_ = 0;
  // The last journaled batch's mid_step_before; guarded by mu_.
  bool journaled_mid_step_before_ = false;
  // What JournalAhead wrote, while the store holds it (until the next
  // JournalBatch); guarded by persist_mu_.
  std::optional<BatchRecord> journaled_ahead_;

  CheckpointCatalog catalog_;
  // The async save being written and committed; joined (under the operation
  // slot) before the next save starts, so one snapshot is in memory at a time.
  std::thread committer_;
};

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_TRAINING_JOB_H_
