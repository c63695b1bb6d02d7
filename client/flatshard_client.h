// libflatshard_client: the coordinator's JobService from C++, with absl::Status
// errors carrying the coordinator's message and code. What the `flatshard`
// CLI is built on; a training script can use it directly.
#ifndef FLATSHARD_CLIENT_FLATSHARD_CLIENT_H_
#define FLATSHARD_CLIENT_FLATSHARD_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <grpcpp/client_context.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rpc/tls_credentials.h"

#include "flatshard/v1/job.grpc.pb.h"

namespace flatshard {

// Where the coordinator is and how to prove who we are to it.
struct CoordinatorTarget {
  std::string address = "127.0.0.1:7070";  // -c, FLATSHARD_COORDINATOR
  TlsFiles tls;                            // --tls-*, FLATSHARD_TLS_*
  std::string token;                       // --token, FLATSHARD_TOKEN
  std::string token_file;                  // --token-file, FLATSHARD_TOKEN_FILE
};

class FlatshardClient {
 public:
  // Does not connect yet; the first call does (and fails UNAVAILABLE naming
  // the address if nothing listens there). A bad TLS or token file fails
  // every call with INVALID_ARGUMENT naming it.
  explicit FlatshardClient(const std::string& address);  // plaintext, no token
  explicit FlatshardClient(const CoordinatorTarget& target);

  const std::string& address() const { return address_; }

  absl::StatusOr<v1::Job> CreateJob(const v1::JobSpec& spec);
  absl::StatusOr<v1::Job> GetJob(const std::string& name);
  absl::StatusOr<std::vector<v1::Job>> ListJobs();
  absl::Status DeleteJob(const std::string& name);
  absl::StatusOr<std::string> Plan(const v1::JobSpec& spec);
  absl::StatusOr<std::vector<v1::WorkerInfo>> ListWorkers(const std::string& job = "");
  // Starts a training operation and calls `on_step` for every step as the
  // coordinator streams it. The operation outlives this call: a stream cut
  // (UNAVAILABLE) leaves it running on the coordinator.
  absl::Status Train(const std::string& job, int64_t steps, int no_sync_micro_steps,
                     const std::function<void(const v1::StepResult&)>& on_step);
  // The same with every option (attach, detach, started_by).
  absl::Status Train(const v1::TrainRequest& request,
                     const std::function<void(const v1::StepResult&)>& on_step);
  // Asks the running training to end after its current step.
  absl::StatusOr<v1::StopTrainingResponse> StopTraining(const std::string& job);
  absl::Status Unshard(const std::string& job, const std::vector<int>& units);
  absl::Status Reshard(const std::string& job, const std::vector<int>& units);
  absl::Status SummonFullParams(
      const std::string& job, bool with_grads, int64_t chunk_bytes,
      const std::function<absl::Status(const v1::TensorChunk&)>& on_chunk);
  absl::StatusOr<v1::StateDictSettings> SetStateDictSettings(const std::string& job,
                                                             const v1::StateDictSettings& settings);
  // Checkpoints: the final progress message of a save or load.
  // `on_progress` sees every message (an async save's snapshot first).
  absl::StatusOr<v1::CheckpointProgress> SaveCheckpoint(
      const v1::SaveCheckpointRequest& request,
      const std::function<void(const v1::CheckpointProgress&)>& on_progress = {});
  absl::StatusOr<v1::CheckpointProgress> LoadCheckpoint(const std::string& job,
                                                        const std::string& name);
  absl::StatusOr<std::vector<v1::CheckpointInfo>> ListCheckpoints(const std::string& job);
  absl::Status DeleteCheckpoint(const std::string& job, const std::string& name);
  // Streams the job's events (past ones first) until `on_event` returns false
  // or the job goes away.
  absl::Status WatchEvents(const std::string& job,
                           const std::function<bool(const v1::JobEvent&)>& on_event);
  // Waits (on WatchEvents, not by polling) until the job is in one of
  // `states`; FAILED when not asked for is an error carrying the failure.
  // Events replay from the job's creation, so a state it was in before
  // counts; with `after`, only a state entered after the job was in one of
  // `after` does (READY after RECOVERING: the end of a recovery).
  absl::StatusOr<v1::JobState> WaitForState(const std::string& job,
                                            const std::set<v1::JobState>& states,
                                            absl::Duration timeout,
                                            const std::set<v1::JobState>& after = {});

 private:
  absl::Status Error(const grpc::Status& status) const;
  // The token on the call; the setup error if the target's files were bad.
  absl::Status Prepare(grpc::ClientContext& context) const;

  std::string address_;
  absl::Status setup_;
  std::string token_;
  std::unique_ptr<v1::JobService::Stub> stub_;
};

}  // namespace flatshard

#endif  // FLATSHARD_CLIENT_FLATSHARD_CLIENT_H_
