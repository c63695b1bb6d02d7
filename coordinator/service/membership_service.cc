#include "coordinator/service/membership_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "rpc/call_metadata.h"

#include "proto/grpc_status.h"

namespace flatshard {

namespace {

// Longest host, address, id or name a registration (or state a heartbeat)
// may carry.
constexpr size_t kMaxRegistrationField = 256;

absl::Status CheckRegistrationSizes(const v1::RegisterRequest& r) {
  for (const auto& [field, value] :
       {std::pair{"worker_id", &r.worker_id()}, std::pair{"host", &r.host()},
        std::pair{"device", &r.device()}, std::pair{"address", &r.address()},
        std::pair{"metrics_address", &r.metrics_address()},
        std::pair{"device_name", &r.device_name()},
        std::pair{"identity_secret", &r.identity_secret()},
        std::pair{"command_token", &r.command_token()},
        std::pair{"incarnation", &r.incarnation()}}) {
    if (value->size() > kMaxRegistrationField) {
      return absl::ResourceExhaustedError(absl::StrCat("register.", field, " is ", value->size(),
                                                       " bytes; the limit is ",
                                                       kMaxRegistrationField));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status MembershipService::CheckSession(const grpc::ServerContext& context,
                                             const char* call) const {
  if (members_->HasSession(MetadataValue(context, kSessionKey))) return absl::OkStatus();
  return absl::UnauthenticatedError(absl::StrCat(
      call, " needs a registered worker's session (metadata ", kSessionKey, "); register first"));
}

grpc::Status MembershipService::Register(grpc::ServerContext* context,
                                         const v1::RegisterRequest* request,
                                         v1::RegisterResponse* response) {
  if (auth_ != nullptr) {
    absl::StatusOr<Principal> who = auth_->Authorize(*context, "Register", Role::kWorker);
    if (!who.ok()) return ToGrpcStatus(who.status());
  }
  if (absl::Status sizes = CheckRegistrationSizes(*request); !sizes.ok()) {
    return ToGrpcStatus(sizes);
  }
  Registration r{request->worker_id(),      request->host(),
                 request->device(),         request->address(),
                 request->requested_rank(), request->metrics_address(),
                 request->device_name(),    request->identity_secret(),
                 request->command_token(),  request->incarnation()};
  absl::StatusOr<MembershipTable::Registered> registered = members_->Register(r, absl::Now());
  if (!registered.ok()) return ToGrpcStatus(registered.status());
  response->set_rank(registered->rank);
  response->set_session(registered->session);
  response->set_heartbeat_interval_seconds(absl::ToDoubleSeconds(heartbeat_interval_));
  return grpc::Status::OK;
}

grpc::Status MembershipService::Heartbeat(grpc::ServerContext* context,
                                          const v1::HeartbeatRequest* request,
                                          v1::HeartbeatResponse* response) {
  if (request->state().size() > kMaxRegistrationField) {
    return ToGrpcStatus(
        absl::ResourceExhaustedError(absl::StrCat("heartbeat.state is ", request->state().size(),
                                                  " bytes; the limit is ", kMaxRegistrationField)));
  }
  absl::Status status =
      members_->Heartbeat(request->worker_id(), MetadataValue(*context, kSessionKey),
                          request->last_completed_seq(), request->state(), absl::Now());
  if (!status.ok()) return ToGrpcStatus(status);
  if (abort_query_) {
    if (std::optional<uint64_t> epoch = abort_query_(request->worker_id())) {
      response->set_abort(true);
      response->set_epoch(*epoch);
    }
  }
  return grpc::Status::OK;
}

grpc::Status MembershipService::StoreSet(grpc::ServerContext* context,
                                         const v1::StoreSetRequest* request,
                                         v1::StoreSetResponse*) {
  if (absl::Status s = CheckSession(*context, "StoreSet"); !s.ok()) return ToGrpcStatus(s);
  return ToGrpcStatus(store_->Set(request->key(), request->value()));
}

grpc::Status MembershipService::StoreGet(grpc::ServerContext* context,
                                         const v1::StoreGetRequest* request,
                                         v1::StoreGetResponse* response) {
  if (absl::Status s = CheckSession(*context, "StoreGet"); !s.ok()) return ToGrpcStatus(s);
  absl::StatusOr<std::string> value = store_->Get(request->key());
  if (!value.ok()) return ToGrpcStatus(value.status());
  response->set_value(*std::move(value));
  return grpc::Status::OK;
}

grpc::Status MembershipService::StoreWait(grpc::ServerContext* context,
                                          const v1::StoreWaitRequest* request,
                                          v1::StoreWaitResponse*) {
  if (absl::Status s = CheckSession(*context, "StoreWait"); !s.ok()) return ToGrpcStatus(s);
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
  if (request->keys().size() > kMaxWaitKeys) {
    return ToGrpcStatus(absl::ResourceExhaustedError(absl::StrCat(
        "store_wait.keys has ", request->keys().size(), " keys; the limit is ", kMaxWaitKeys)));
  }
  const std::string session(MetadataValue(*context, kSessionKey));
  {
    std::lock_guard<std::mutex> lock(waits_mu_);
    int& in_flight = waits_by_session_[session];
    if (in_flight >= kMaxWaitsPerSession) {
      return ToGrpcStatus(absl::ResourceExhaustedError(
          absl::StrCat("store_wait: this session has ", in_flight,
                       " waits in flight; the limit is ", kMaxWaitsPerSession)));
    }
    ++in_flight;
  }
  const std::vector<std::string> keys(request->keys().begin(), request->keys().end());
  const absl::Status waited =
      store_->Wait(keys, timeout, [context] { return context->IsCancelled(); });
  {
    std::lock_guard<std::mutex> lock(waits_mu_);
    if (--waits_by_session_[session] == 0) waits_by_session_.erase(session);
  }
  return ToGrpcStatus(waited);
}

grpc::Status MembershipService::StoreAdd(grpc::ServerContext* context,
                                         const v1::StoreAddRequest* request,
                                         v1::StoreAddResponse* response) {
  if (absl::Status s = CheckSession(*context, "StoreAdd"); !s.ok()) return ToGrpcStatus(s);
  absl::StatusOr<int64_t> value = store_->Add(request->key(), request->delta());
  if (!value.ok()) return ToGrpcStatus(value.status());
  response->set_value(*value);
  return grpc::Status::OK;
}

}  // namespace flatshard
