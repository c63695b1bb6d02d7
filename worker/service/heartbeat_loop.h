// A worker's side of membership: registers with the coordinator, then
// heartbeats at the interval the coordinator asks for, reporting its last
// completed seq and state. A heartbeat answered with `abort` (the job failed
// on another rank) aborts the worker's collectives; one answered NOT_FOUND (the
// coordinator restarted) registers again under the same id. A worker whose
// coordinator stays silent with a batch in flight aborts the batch. Aborts run
// on a thread of their own: closing a job's Gloo pairs waits for their event
// loop (tens of milliseconds per abort here, more under load), and a heartbeat
// thread that waited would miss beats and get a live worker failed.
#ifndef FLATSHARD_WORKER_SERVICE_HEARTBEAT_LOOP_H_
#define FLATSHARD_WORKER_SERVICE_HEARTBEAT_LOOP_H_

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <grpcpp/channel.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rpc/call_metadata.h"

#include "flatshard/v1/membership.grpc.pb.h"
#include "worker/service/worker_service.h"

namespace flatshard {

class HeartbeatLoop {
 public:
  // With a batch in flight and no answer from the coordinator for
  // `coordinator_timeout`, the worker aborts the batch.
  // `credentials` carries the join token to Register and receives the session.
  HeartbeatLoop(std::shared_ptr<grpc::Channel> channel, v1::RegisterRequest registration,
                WorkerServiceImpl* service, std::shared_ptr<WorkerCallCredentials> credentials,
                absl::Duration coordinator_timeout = absl::Seconds(10));
  ~HeartbeatLoop();

  // Waits up to `connect_timeout` for the coordinator, then registers; the rank.
  absl::StatusOr<int> Register(absl::Duration connect_timeout);
  void Start();
  void Stop();
  // A batch ended: if the worker is still idle a moment later (training has
  // finished, not just a step), beat now instead of up to an interval later,
  // so `flatshard workers` does not show a finished worker as running.
  void BatchEnded();

 private:
  void Run();
  absl::Status Beat();
  // Hands an abort of job `epoch` (or older) to the aborter thread; a newer
  // request replaces one not yet carried out. `only_while_running`: skipped if
  // the batch in flight has ended by the time it runs.
  void RequestAbort(std::string reason, uint64_t epoch, bool only_while_running = false);
  void RunAborts();
  // Until the next beat is due (an interval, never later, however often
  // batches end) or, after a batch ended, the worker has stayed idle for a
  // moment; returns early when stopped.
  void WaitForNextBeat(std::unique_lock<std::mutex>& lock);

  std::unique_ptr<v1::Membership::Stub> stub_;
  v1::RegisterRequest registration_;
  WorkerServiceImpl* service_;
  std::shared_ptr<WorkerCallCredentials> credentials_;
  const absl::Duration coordinator_timeout_;
  absl::Duration interval_ = absl::Seconds(1);
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool batch_ended_ = false;
  struct PendingAbort {
    std::string reason;
    uint64_t epoch = 0;
    bool only_while_running = false;
  };
  std::optional<PendingAbort> pending_abort_;  // guarded by mu_
  std::condition_variable abort_cv_;
  std::thread thread_;
  std::thread aborter_;
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_SERVICE_HEARTBEAT_LOOP_H_
