// The coordinator's handle on one worker. The sequencer only needs Execute
// (asynchronous, so a step costs one concurrent round trip to every worker,
// not W sequential ones) and Cancel; an async save's commit needs AwaitSave
// and GetStatusAsync (asynchronous too, so awaiting every rank's write holds
// no thread per rank). Aborts and probes go to every worker at once
// (worker_fan_out.h), so they are asynchronous as well: a thread per worker
// was 16,384 threads for one abort at that scale. Their blocking forms wait
// for the asynchronous call. A summon streams from rank 0 alone, into a
// blocking sink on the caller's thread; every other rank only joins it, with
// an asynchronous call. The real implementation is gRPC
// (GrpcWorkerClient), and the scale benchmark uses light in-process fakes.
#ifndef FLATSHARD_COORDINATOR_WORKER_CLIENT_H_
#define FLATSHARD_COORDINATOR_WORKER_CLIENT_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "flatshard/v1/job.pb.h"
#include "flatshard/v1/worker.pb.h"

namespace flatshard {

class WorkerClient {
 public:
  using ExecuteDone = std::function<void(absl::StatusOr<v1::CommandResult>)>;
  using AwaitSaveDone = std::function<void(absl::StatusOr<v1::CommandResult>)>;
  using GetStatusDone = std::function<void(absl::StatusOr<v1::GetStatusResponse>)>;
  using AbortDone = std::function<void(absl::Status)>;
  using ConfigureDone = std::function<void(absl::Status)>;
  using ChunkSink = std::function<absl::Status(const v1::TensorChunk&)>;
  using JoinSummonDone = std::function<void(absl::Status)>;

  virtual ~WorkerClient() = default;

  // Starts one batch. `batch` must stay alive until `done` has run; `done`
  // runs exactly once, on any thread.
  virtual void Execute(const v1::CommandBatch* batch, absl::Time deadline, ExecuteDone done) = 0;
  // Cancels every call in flight (their `done` sees CANCELLED).
  virtual void CancelAll() = 0;

  // A blocking call, used outside the per-step path: runs a summon batch; each chunk the worker
  // streams goes to `sink`.
  virtual absl::Status Summon(const v1::CommandBatch& batch, absl::Time deadline,
                              const ChunkSink& sink) = 0;
  // Runs a summon batch on a rank that streams nothing back (every rank but
  // 0): it takes part in the summon's collectives, and its answer is the
  // outcome. A chunk from it fails the call (INTERNAL) and cancels it.
  // `batch` must stay alive until `done` has run; `done` runs exactly once,
  // on any thread. CancelAll cancels it.
  virtual void JoinSummonAsync(const v1::CommandBatch* batch, absl::Time deadline,
                               JoinSummonDone done) = 0;
  // Asynchronous calls: `done` runs exactly once, on any thread (also on
  // this one, before the call returns, for a call that cannot start).
  // Configures the worker for an epoch: its first call, so a worker whose
  // server is not accepting connections yet may connect until `connect_by`
  // (UNAVAILABLE after that). The call is held until every rank has arrived
  // at the epoch's rendezvous; CancelAll cancels it.
  virtual void ConfigureAsync(v1::ConfigureRequest request, absl::Time connect_by,
                              absl::Time deadline, ConfigureDone done) = 0;
  // Waits for the background write of an async save into `directory`; a
  // call in flight is cancelled by CancelAll.
  virtual void AwaitSave(const std::string& directory, absl::Time deadline, AwaitSaveDone done) = 0;
  // GetStatus without a thread waiting on it; like GetStatus, not cancelled
  // by CancelAll.
  virtual void GetStatusAsync(absl::Time deadline, GetStatusDone done) = 0;
  // Aborts `epoch` (the worker refuses an epoch older than its own). Not
  // cancelled by CancelAll: it is how a failure ends.
  virtual void AbortAsync(uint64_t epoch, const std::string& reason, absl::Time deadline,
                          AbortDone done) = 0;

  // The blocking forms of ConfigureAsync, GetStatusAsync and AbortAsync:
  // each waits for its call's `done`. Not on a gRPC callback thread (the
  // answer may need it).
  absl::Status Configure(const v1::ConfigureRequest& request, absl::Time deadline);
  absl::StatusOr<v1::GetStatusResponse> GetStatus(absl::Time deadline);
  absl::Status Abort(uint64_t epoch, const std::string& reason, absl::Time deadline);

  // The coordinator has given this worker up (a recovery's probe could not
  // reach it): every call in flight is cancelled, even those CancelAll
  // leaves (their `done` sees CANCELLED), and waited for; the client lets
  // its connection go and dials the address no more; every later call fails
  // at once, UNAVAILABLE. Left to its idle timeout, a channel to a dead
  // worker redials its address for up to a minute at scale
  // (grpc_worker_client.h says why that matters). Not on a gRPC callback
  // thread (it waits for the calls' callbacks).
  virtual void Disconnect() = 0;

  virtual std::string address() const = 0;
};

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_WORKER_CLIENT_H_
