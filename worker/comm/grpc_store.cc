#include "worker/comm/grpc_store.h"

#include <grpcpp/client_context.h>

#include "proto/grpc_status.h"

namespace flatshard {
namespace {

// Unary calls get a deadline so a vanished coordinator fails them.
constexpr absl::Duration kCallDeadline = absl::Seconds(30);

}  // namespace

void GrpcStore::Prepare(grpc::ClientContext& context, absl::Duration deadline) const {
  context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  if (credentials_ != nullptr) credentials_->AttachSession(context);
}

absl::Status GrpcStore::Set(const std::string& key, const std::string& value) {
  grpc::ClientContext context;
  Prepare(context, kCallDeadline);
  v1::StoreSetRequest request;
  request.set_key(key);
  request.set_value(value);
  v1::StoreSetResponse response;
  return FromGrpcStatus(stub_->StoreSet(&context, request, &response));
}

absl::StatusOr<std::string> GrpcStore::Get(const std::string& key, absl::Duration timeout) {
  if (absl::Status s = Wait({key}, timeout); !s.ok()) return s;
  grpc::ClientContext context;
  Prepare(context, kCallDeadline);
  v1::StoreGetRequest request;
  request.set_key(key);
  v1::StoreGetResponse response;
  if (absl::Status s = FromGrpcStatus(stub_->StoreGet(&context, request, &response)); !s.ok()) {
    return s;
  }
  return response.value();
}

absl::Status GrpcStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  grpc::ClientContext context;
  Prepare(context, timeout + kCallDeadline);
  v1::StoreWaitRequest request;
  for (const std::string& key : keys) request.add_keys(key);
  request.set_timeout_ms(std::max<int64_t>(1, absl::ToInt64Milliseconds(timeout)));
  v1::StoreWaitResponse response;
  return FromGrpcStatus(stub_->StoreWait(&context, request, &response));
}

absl::StatusOr<int64_t> GrpcStore::Add(const std::string& key, int64_t delta) {
  grpc::ClientContext context;
  Prepare(context, kCallDeadline);
  v1::StoreAddRequest request;
  request.set_key(key);
  request.set_delta(delta);
  v1::StoreAddResponse response;
  if (absl::Status s = FromGrpcStatus(stub_->StoreAdd(&context, request, &response)); !s.ok()) {
    return s;
  }
  return response.value();
}

}  // namespace flatshard
