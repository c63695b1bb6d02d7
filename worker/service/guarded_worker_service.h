// WorkerService as a worker daemon serves it: only the coordinator it
// registered with may call. Every call must carry the command token the worker
// made at start and sent in its registration (so it travels only to that
// coordinator, over TLS when configured), and under mutual TLS must come from
// the coordinator's certificate. Abort is also checked against the worker's
// epoch, so a stale one cannot stop a newer epoch (Execute's epoch and seq,
// and Configure's epoch, are checked by the worker itself).
#ifndef FLATSHARD_WORKER_SERVICE_GUARDED_WORKER_SERVICE_H_
#define FLATSHARD_WORKER_SERVICE_GUARDED_WORKER_SERVICE_H_

#include <string>

#include "absl/status/status.h"

#include "flatshard/v1/worker.grpc.pb.h"
#include "worker/service/worker_service.h"

namespace flatshard {

struct WorkerCallPolicy {
  std::string command_token;              // required on every call
  bool require_coordinator_cert = false;  // mutual TLS: the caller's CN
};

class GuardedWorkerService final : public v1::WorkerService::Service {
 public:
  GuardedWorkerService(WorkerServiceImpl* inner, WorkerCallPolicy policy)
      : inner_(inner), policy_(std::move(policy)) {}

  grpc::Status Configure(grpc::ServerContext* context, const v1::ConfigureRequest* request,
                         v1::ConfigureResponse* response) override;
  grpc::Status Execute(grpc::ServerContext* context, const v1::CommandBatch* request,
                       v1::CommandResult* response) override;
  grpc::Status Summon(grpc::ServerContext* context, const v1::CommandBatch* request,
                      grpc::ServerWriter<v1::TensorChunk>* writer) override;
  grpc::Status GetStatus(grpc::ServerContext* context, const v1::GetStatusRequest* request,
                         v1::GetStatusResponse* response) override;
  grpc::Status AwaitSave(grpc::ServerContext* context, const v1::AwaitSaveRequest* request,
                         v1::CommandResult* response) override;
  grpc::Status Abort(grpc::ServerContext* context, const v1::AbortRequest* request,
                     v1::AbortResponse* response) override;

 private:
  // UNAUTHENTICATED without the command token, PERMISSION_DENIED from a
  // certificate that is not the coordinator's.
  absl::Status CheckCaller(const grpc::ServerContext& context, const char* call) const;

  WorkerServiceImpl* inner_;
  const WorkerCallPolicy policy_;
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_SERVICE_GUARDED_WORKER_SERVICE_H_
