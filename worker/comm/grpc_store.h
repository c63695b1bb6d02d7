// The worker's Store over the coordinator's Membership service: Gloo rendezvous
// and the NCCL unique id go through the coordinator, so no extra service is
// needed (docs/architecture.md §1). Waits are server-side (StoreWait), not polls.
#ifndef FLATSHARD_WORKER_COMM_GRPC_STORE_H_
#define FLATSHARD_WORKER_COMM_GRPC_STORE_H_

#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>

#include "rpc/call_metadata.h"

#include "flatshard/v1/membership.grpc.pb.h"
#include "worker/comm/store.h"

namespace flatshard {

class GrpcStore : public Store {
 public:
  // `credentials` supplies the registration session every store call carries.
  GrpcStore(std::shared_ptr<grpc::Channel> channel,
            std::shared_ptr<const WorkerCallCredentials> credentials)
      : stub_(v1::Membership::NewStub(std::move(channel))), credentials_(std::move(credentials)) {}

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;
  // Cancels the calls in flight (a StoreWait waits server-side) and refuses
  // later ones.
  void Abort(const std::string& reason) override;

 private:
  // One call: its context is registered so Abort can cancel it, and a call
  // the abort cancelled reports the abort.
  template <typename Fn>
  absl::Status Call(absl::Duration deadline, Fn&& rpc);

  std::unique_ptr<v1::Membership::Stub> stub_;
  std::shared_ptr<const WorkerCallCredentials> credentials_;
  std::mutex mu_;
  std::optional<std::string> aborted_;    // guarded by mu_
  std::set<grpc::ClientContext*> calls_;  // guarded by mu_
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_COMM_GRPC_STORE_H_
