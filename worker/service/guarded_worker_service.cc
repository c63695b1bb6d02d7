#include "worker/service/guarded_worker_service.h"

#include "absl/strings/str_cat.h"
#include "rpc/call_metadata.h"
#include "rpc/secrets.h"
#include "rpc/tls_credentials.h"

#include "proto/grpc_status.h"

namespace flatshard {

absl::Status GuardedWorkerService::CheckCaller(const grpc::ServerContext& context,
                                               const char* call) const {
  if (policy_.require_coordinator_cert) {
    const std::string name = PeerCommonName(context);
    if (name != kCoordinatorIdentity) {
      return absl::PermissionDeniedError(absl::StrCat(
          "WorkerService.", call, " is accepted only from the coordinator's certificate (CN ",
          kCoordinatorIdentity, "); this caller's is '", name, "'"));
    }
  }
  if (!ConstantTimeEquals(MetadataValue(context, kCommandTokenKey), policy_.command_token)) {
    return absl::UnauthenticatedError(
        absl::StrCat("WorkerService.", call,
                     " needs the command token this worker registered with; only its "
                     "coordinator has it"));
  }
  return absl::OkStatus();
}

grpc::Status GuardedWorkerService::Configure(grpc::ServerContext* context,
                                             const v1::ConfigureRequest* request,
                                             v1::ConfigureResponse* response) {
  // Its epoch is checked by the worker (positive; every later batch must
  // carry it). An older epoch is not refused here: a job deleted and created
  // again under its name starts over at epoch 1, and only the coordinator
  // holding the command token can send a Configure at all.
  if (absl::Status s = CheckCaller(*context, "Configure"); !s.ok()) return ToGrpcStatus(s);
  return inner_->Configure(context, request, response);
}

grpc::Status GuardedWorkerService::Execute(grpc::ServerContext* context,
                                           const v1::CommandBatch* request,
                                           v1::CommandResult* response) {
  if (absl::Status s = CheckCaller(*context, "Execute"); !s.ok()) return ToGrpcStatus(s);
  return inner_->Execute(context, request, response);
}

grpc::Status GuardedWorkerService::Summon(grpc::ServerContext* context,
                                          const v1::CommandBatch* request,
                                          grpc::ServerWriter<v1::TensorChunk>* writer) {
  if (absl::Status s = CheckCaller(*context, "Summon"); !s.ok()) return ToGrpcStatus(s);
  return inner_->Summon(context, request, writer);
}

grpc::Status GuardedWorkerService::GetStatus(grpc::ServerContext* context,
                                             const v1::GetStatusRequest* request,
                                             v1::GetStatusResponse* response) {
  if (absl::Status s = CheckCaller(*context, "GetStatus"); !s.ok()) return ToGrpcStatus(s);
  return inner_->GetStatus(context, request, response);
}

grpc::Status GuardedWorkerService::AwaitSave(grpc::ServerContext* context,
                                             const v1::AwaitSaveRequest* request,
                                             v1::CommandResult* response) {
  if (absl::Status s = CheckCaller(*context, "AwaitSave"); !s.ok()) return ToGrpcStatus(s);
  return inner_->AwaitSave(context, request, response);
}

grpc::Status GuardedWorkerService::Abort(grpc::ServerContext* context,
                                         const v1::AbortRequest* request,
                                         v1::AbortResponse* response) {
  if (absl::Status s = CheckCaller(*context, "Abort"); !s.ok()) return ToGrpcStatus(s);
  const WorkerStatus now = inner_->Status();
  if (request->job_epoch() != 0 && request->job_epoch() < now.job_epoch) {
    return ToGrpcStatus(absl::FailedPreconditionError(absl::StrCat(
        "abort.job_epoch ", request->job_epoch(), " is older than this worker's epoch ",
        now.job_epoch, ": a stale abort does not stop a newer epoch")));
  }
  return inner_->Abort(context, request, response);
}

}  // namespace flatshard
