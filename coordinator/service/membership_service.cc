#include "coordinator/service/membership_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

#include "proto/grpc_status.h"

namespace flatshard {

grpc::Status MembershipService::Register(grpc::ServerContext*, const v1::RegisterRequest* request,
                                         v1::RegisterResponse* response) {
  Registration r{request->worker_id(),  request->host(),           request->device(),
                 request->address(),    request->requested_rank(), request->metrics_address(),
                 request->device_name()};
  absl::StatusOr<int> rank = members_->Register(r, absl::Now());
  if (!rank.ok()) return ToGrpcStatus(rank.status());
  response->set_rank(*rank);
  response->set_heartbeat_interval_seconds(absl::ToDoubleSeconds(heartbeat_interval_));
  return grpc::Status::OK;
}

grpc::Status MembershipService::Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                                          v1::HeartbeatResponse* response) {
  absl::Status status = members_->Heartbeat(request->worker_id(), request->last_completed_seq(),
                                            request->state(), absl::Now());
  if (!status.ok()) return ToGrpcStatus(status);
  if (abort_query_) {
    if (std::optional<uint64_t> epoch = abort_query_(request->worker_id())) {
      response->set_abort(true);
      response->set_epoch(*epoch);
    }
  }
  return grpc::Status::OK;
}

grpc::Status MembershipService::StoreSet(grpc::ServerContext*, const v1::StoreSetRequest* request,
                                         v1::StoreSetResponse*) {
  return ToGrpcStatus(store_->Set(request->key(), request->value()));
}

grpc::Status MembershipService::StoreGet(grpc::ServerContext*, const v1::StoreGetRequest* request,
                                         v1::StoreGetResponse* response) {
  absl::StatusOr<std::string> value = store_->Get(request->key());
  if (!value.ok()) return ToGrpcStatus(value.status());
  response->set_value(*std::move(value));
  return grpc::Status::OK;
}

grpc::Status MembershipService::StoreWait(grpc::ServerContext* context,
                                          const v1::StoreWaitRequest* request,
                                          v1::StoreWaitResponse*) {
  if (request->keys().empty()) {
    return ToGrpcStatus(absl::InvalidArgumentError("store_wait.keys must not be empty"));
  }
  if (request->timeout_ms() < 0) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("store_wait.timeout_ms must be >= 0, got ", request->timeout_ms())));
  }
  absl::Duration timeout =
      request->timeout_ms() == 0 ? absl::Seconds(60) : absl::Milliseconds(request->timeout_ms());
  if (timeout > kMaxWait) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("store_wait.timeout_ms must be at most ", absl::ToInt64Milliseconds(kMaxWait),
                     ", got ", request->timeout_ms())));
  }
  // Never wait past the caller's own deadline.
  const absl::Duration left = absl::FromChrono(context->deadline()) - absl::Now();
  timeout = std::min(timeout, std::max(left, absl::ZeroDuration()));
  const std::vector<std::string> keys(request->keys().begin(), request->keys().end());
  return ToGrpcStatus(store_->Wait(keys, timeout));
}

grpc::Status MembershipService::StoreAdd(grpc::ServerContext*, const v1::StoreAddRequest* request,
                                         v1::StoreAddResponse* response) {
  absl::StatusOr<int64_t> value = store_->Add(request->key(), request->delta());
  if (!value.ok()) return ToGrpcStatus(value.status());
  response->set_value(*value);
  return grpc::Status::OK;
}

}  // namespace flatshard
