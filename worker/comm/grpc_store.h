// The worker's Store over the coordinator's Membership service: Gloo rendezvous
// and the NCCL unique id go through the coordinator, so no extra service is
// needed (docs/architecture.md §1). Waits are server-side (StoreWait), not polls.
#ifndef FLATSHARD_WORKER_COMM_GRPC_STORE_H_
#define FLATSHARD_WORKER_COMM_GRPC_STORE_H_

#include <memory>
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

 private:
  void Prepare(grpc::ClientContext& context, absl::Duration deadline) const;

  std::unique_ptr<v1::Membership::Stub> stub_;
  std::shared_ptr<const WorkerCallCredentials> credentials_;
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_COMM_GRPC_STORE_H_
