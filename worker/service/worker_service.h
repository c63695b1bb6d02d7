// flatshard.v1.WorkerService: what a worker daemon does for the coordinator.
// Configure builds the data plane of one job epoch (a collective: every rank
// rendezvouses through the coordinator's store); Execute runs one step,
// control or checkpoint batch, Summon one summon batch, both routed by the
// batch's kind and through the BatchExecutor's ordering checks.
// Abort (or a heartbeat saying the job failed) fails the collectives in flight
// so a step blocked on a dead peer returns instead of hanging; the daemon
// keeps serving and can be configured again for a new epoch.
#ifndef FLATSHARD_WORKER_SERVICE_WORKER_SERVICE_H_
#define FLATSHARD_WORKER_SERVICE_WORKER_SERVICE_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "absl/time/time.h"

#include "flatshard/v1/worker.grpc.pb.h"
#include "storage/file_system.h"
#include "worker/comm/abort_signal.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/store.h"
#include "worker/device/device.h"
#include "worker/device/memory_tracker.h"
#include "worker/runtime/runtime_groups.h"
#include "worker/runtime/runtime_observer.h"
#include "worker/service/abort_watchdog.h"
#include "worker/service/peer_snapshot_store.h"

namespace flatshard {

struct WorkerServiceOptions {
  std::string data_dir = ".";
  std::string checkpoint_dir = "./checkpoints";  // checkpoint directories are relative to it
  // The rendezvous store for one epoch's key namespace (a GrpcStore to the
  // coordinator under a PrefixStore in the daemon, a FileStore in tests).
  std::function<std::shared_ptr<Store>(const std::string& prefix)> store_for_prefix;
  GlooOptions gloo;  // hostname peers connect to; collective timeout
  // The device every job of this worker computes on (one per daemon, kept across
  // re-formations), and the collectives backend for its memory.
  std::shared_ptr<Device> device;
  CommBackend comm = CommBackend::kAuto;
  // The metrics observer for the runtime of `job` as `rank` (null: none).
  std::function<RuntimeObserver*(const std::string& job, int rank)> observer_for_job;
  // Where checkpoint files are written (null: FileSystem::Default()).
  FileSystem* file_system = nullptr;
  // A batch still running this long after an abort is wedged
  // (worker/service/abort_watchdog.h): `on_wedged` is told what (the daemon
  // exits). Zero: never.
  absl::Duration abort_grace = absl::ZeroDuration();
  std::function<void(const std::string& what)> on_wedged;
};

// The worker's state as GetStatus and heartbeats report it.
struct WorkerStatus {
  int rank = -1;
  uint64_t job_epoch = 0;
  uint64_t last_completed_seq = 0;
  std::string state;  // idle, configuring, ready, running, failed, aborted
  std::string abort_reason;
  // How long aborted work has been running without letting go; zero: none.
  absl::Duration draining = absl::ZeroDuration();
  // The current job's runtime's work counter (FsdpRuntime::progress); 0
  // without a job.
  uint64_t progress = 0;
  // Its async saves' background writes' counter (BackgroundSaves::progress).
  uint64_t save_progress = 0;
};

// What the metrics read at scrape time.
struct WorkerSnapshot {
  WorkerStatus status;
  std::string job_name;  // empty: no job configured
  struct Bytes {
    int64_t current = 0;
    int64_t peak = 0;
  };
  std::array<Bytes, static_cast<size_t>(MemoryKind::kCount)> memory{};
  // The device's own view: its pool and, on a GPU, cudaMemGetInfo.
  std::string device_kind;  // empty: no device
  DeviceMemoryStats device_memory;
  int64_t peer_snapshot_bytes = 0;  // in-memory peer snapshots held (own and received)
};

class WorkerServiceImpl final : public v1::WorkerService::Service {
 public:
  explicit WorkerServiceImpl(WorkerServiceOptions options);
  ~WorkerServiceImpl() override;

  grpc::Status Configure(grpc::ServerContext* context, const v1::ConfigureRequest* request,
                         v1::ConfigureResponse* response) override;
  grpc::Status Execute(grpc::ServerContext* context, const v1::CommandBatch* request,
                       v1::CommandResult* response) override;
  grpc::Status Summon(grpc::ServerContext* context, const v1::CommandBatch* request,
                      grpc::ServerWriter<v1::TensorChunk>* writer) override;
  grpc::Status AwaitSave(grpc::ServerContext* context, const v1::AwaitSaveRequest* request,
                         v1::CommandResult* response) override;
  grpc::Status GetStatus(grpc::ServerContext* context, const v1::GetStatusRequest* request,
                         v1::GetStatusResponse* response) override;
  grpc::Status Abort(grpc::ServerContext* context, const v1::AbortRequest* request,
                     v1::AbortResponse* response) override;

  // Fails the collectives of the current job, if any, and stops its async
  // saves' background writes (idempotent; the coordinator abandons the
  // checkpoints of a job that failed, and a daemon shutting down must not
  // wait for a write that may never return). With
  // `epoch` set, only a job of that epoch or older: an abort decided against
  // one epoch and carried out after a Configure leaves the newer one alone.
  // A Configure building its runtime meanwhile is aborted too: its
  // rendezvous fails at once and it installs nothing.
  void AbortJob(const std::string& reason, uint64_t epoch = 0);
  // Aborts as AbortJob does, and refuses every later Configure: the daemon is
  // stopping, and its server waits for the calls it serves.
  void Shutdown(const std::string& reason);
  WorkerStatus Status() const;
  WorkerSnapshot Snapshot() const;
  // Called (outside the service's locks) after every batch ends: the
  // heartbeat reports a worker that went idle without waiting a whole interval.
  void set_batch_end_observer(std::function<void()> observer);

 private:
  struct ActiveJob;

  std::shared_ptr<ActiveJob> CurrentJob() const;
  // Execute and Summon: the job, BeginBatch, Dispatch, EndBatch.
  absl::Status RunBatch(const v1::CommandBatch& batch, v1::CommandResult* result,
                        grpc::ServerWriter<v1::TensorChunk>* writer);
  // The one place a batch is routed, by its kind. `result` is the Execute
  // RPC's answer, `writer` the Summon RPC's stream; exactly one is set, and a
  // kind sent through the other RPC is refused. No kind: INVALID_ARGUMENT.
  absl::Status Dispatch(ActiveJob& job, const v1::CommandBatch& batch, v1::CommandResult* result,
                        grpc::ServerWriter<v1::TensorChunk>* writer);
  absl::Status RunStep(ActiveJob& job, const v1::CommandBatch& batch, v1::CommandResult& result);
  absl::Status RunCheckpoint(ActiveJob& job, const v1::CommandBatch& batch,
                             v1::CommandResult& result);
  absl::Status RunPeerSnapshot(ActiveJob& job, const v1::CommandBatch& batch,
                               v1::CommandResult& result);
  absl::Status RunSummon(ActiveJob& job, const v1::CommandBatch& batch,
                         grpc::ServerWriter<v1::TensorChunk>& writer);
  // Marks a batch running, or refuses it when the job was aborted.
  absl::Status BeginBatch(const v1::CommandBatch& batch, uint64_t epoch);
  // Back to ready (failed if the batch poisoned the executor), unless an
  // abort arrived meanwhile.
  void EndBatch(const absl::Status& status);

  WorkerServiceOptions options_;
  AbortWatchdog watchdog_;
  // The batch holding run_mu_ (under state_mu_). A configuration is not
  // watched as a batch: reading the data set cannot see an abort, so time
  // since one says nothing; the configure timeout and the heartbeats bound
  // it instead. The old epoch's background writes it waits for are watched
  // themselves, from the old epoch's abort (BackgroundSaves).
  WatchedBatch batch_;
  // One batch (or configuration) at a time: a worker's runtime is single-use
  // per step, and ordering is the executor's job.
  std::mutex run_mu_;
  // Guards job_, retiring_, configuring_, shutting_down_, status_, batch_ and
  // batch_end_observer_.
  mutable std::mutex state_mu_;
  std::function<void()> batch_end_observer_;
  std::shared_ptr<ActiveJob> job_;
  // The job a Configure replaces, while it waits for the job's aborted
  // background writes: GetStatus reports them draining, so a recovery's
  // probe meanwhile waits for the watchdog's verdict too.
  std::shared_ptr<ActiveJob> retiring_;
  // The abort of the epoch a Configure builds, so an abort reaches its
  // rendezvous: the store's waits, and the Gloo groups' connections (which
  // a store abort cannot wake); null between configurations.
  std::shared_ptr<AbortSignal> configuring_;
  bool shutting_down_ = false;
  // After job_: destroyed first, it waits for an exchange that still uses
  // the job's (by then aborted) snapshot communicator.
  PeerSnapshotStore peer_snapshots_;
  WorkerStatus status_;
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_SERVICE_WORKER_SERVICE_H_
