// flatshard.v1.Membership over gRPC: registration, heartbeats, and the
// rendezvous store (KvStore) that workers' Gloo and NCCL setup go through.
// Validation errors come back as INVALID_ARGUMENT naming the field; the
// service never changes state on a bad request. Registration needs proof
// (a join token or a worker certificate); heartbeats and store calls are
// bound to a registration by its session.
#ifndef FLATSHARD_COORDINATOR_SERVICE_MEMBERSHIP_SERVICE_H_
#define FLATSHARD_COORDINATOR_SERVICE_MEMBERSHIP_SERVICE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "absl/time/time.h"

#include "coordinator/kv_store.h"
#include "coordinator/membership.h"
#include "coordinator/service/authenticator.h"
#include "flatshard/v1/membership.grpc.pb.h"

namespace flatshard {

class MembershipService final : public v1::Membership::Service {
 public:
  // `auth` decides who may register (a join token or a worker certificate);
  // null lets anyone (tests of the protocol alone). Heartbeats and store
  // calls need a registration's session whatever `auth` is.
  MembershipService(MembershipTable* members, KvStore* store, absl::Duration heartbeat_interval,
                    Authenticator* auth = nullptr)
      : members_(members), store_(store), heartbeat_interval_(heartbeat_interval), auth_(auth) {}

  // The epoch a worker must abort (its job failed elsewhere), if any; asked on
  // every heartbeat. Set once, before the server starts.
  using AbortQuery = std::function<std::optional<uint64_t>(const std::string& worker_id)>;
  void set_abort_query(AbortQuery query) { abort_query_ = std::move(query); }

  grpc::Status Register(grpc::ServerContext* context, const v1::RegisterRequest* request,
                        v1::RegisterResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;
  grpc::Status StoreSet(grpc::ServerContext* context, const v1::StoreSetRequest* request,
                        v1::StoreSetResponse* response) override;
  grpc::Status StoreGet(grpc::ServerContext* context, const v1::StoreGetRequest* request,
                        v1::StoreGetResponse* response) override;
  grpc::Status StoreWait(grpc::ServerContext* context, const v1::StoreWaitRequest* request,
                         v1::StoreWaitResponse* response) override;
  grpc::Status StoreAdd(grpc::ServerContext* context, const v1::StoreAddRequest* request,
                        v1::StoreAddResponse* response) override;

  // Longest StoreWait a client may ask for; longer ones are refused rather than
  // left to pin a server thread.
  static constexpr absl::Duration kMaxWait = absl::Minutes(10);
  // Most keys one StoreWait may name.
  static constexpr int kMaxWaitKeys = 4096;
  // Most StoreWaits one session may have in flight: each holds a server
  // thread for up to kMaxWait. A rank waits on one rendezvous at a time.
  static constexpr int kMaxWaitsPerSession = 16;

 private:
  // UNAUTHENTICATED unless the call carries a current registration's session.
  absl::Status CheckSession(const grpc::ServerContext& context, const char* call) const;

  MembershipTable* members_;
  KvStore* store_;
  absl::Duration heartbeat_interval_;
  Authenticator* auth_;
  AbortQuery abort_query_;
  std::mutex waits_mu_;
  std::map<std::string, int> waits_by_session_;  // in flight; guarded by waits_mu_
};

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_SERVICE_MEMBERSHIP_SERVICE_H_
