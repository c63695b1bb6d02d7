#include "worker/comm/grpc_store.h"

#include <grpcpp/client_context.h>

#include "absl/strings/str_cat.h"

#include "proto/grpc_status.h"

namespace flatshard {
namespace {

// Unary calls get a deadline so a vanished coordinator fails them.
constexpr absl::Duration kCallDeadline = absl::Seconds(30);

}  // namespace

template <typename Fn>
absl::Status GrpcStore::Call(absl::Duration deadline, Fn&& rpc) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  if (credentials_ != nullptr) credentials_->AttachSession(context);
  const auto aborted = [this] {
    return absl::AbortedError(absl::StrCat("rendezvous store aborted: ", *aborted_));
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_.has_value()) return aborted();
    calls_.insert(&context);
  }
  absl::Status status = FromGrpcStatus(rpc(&context));
  std::lock_guard<std::mutex> lock(mu_);
  calls_.erase(&context);
  // Whatever a call the abort cancelled returned (CANCELLED, or a reply that
  // crossed the cancellation), the abort is the answer.
  if (aborted_.has_value()) return aborted();
  return status;
}

void GrpcStore::Abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_.has_value()) return;
  aborted_ = reason;
  for (grpc::ClientContext* context : calls_) context->TryCancel();
}

absl::Status GrpcStore::Set(const std::string& key, const std::string& value) {
  v1::StoreSetRequest request;
  request.set_key(key);
  request.set_value(value);
  v1::StoreSetResponse response;
  return Call(kCallDeadline, [&](grpc::ClientContext* context) {
    return stub_->StoreSet(context, request, &response);
  });
}

absl::StatusOr<std::string> GrpcStore::Get(const std::string& key, absl::Duration timeout) {
  if (absl::Status s = Wait({key}, timeout); !s.ok()) return s;
  v1::StoreGetRequest request;
  request.set_key(key);
  v1::StoreGetResponse response;
  if (absl::Status s = Call(kCallDeadline,
                            [&](grpc::ClientContext* context) {
                              return stub_->StoreGet(context, request, &response);
                            });
      !s.ok()) {
    return s;
  }
  return response.value();
}

absl::Status GrpcStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  v1::StoreWaitRequest request;
  for (const std::string& key : keys) request.add_keys(key);
  request.set_timeout_ms(std::max<int64_t>(1, absl::ToInt64Milliseconds(timeout)));
  v1::StoreWaitResponse response;
  return Call(timeout + kCallDeadline, [&](grpc::ClientContext* context) {
    return stub_->StoreWait(context, request, &response);
  });
}

absl::StatusOr<int64_t> GrpcStore::Add(const std::string& key, int64_t delta) {
  v1::StoreAddRequest request;
  request.set_key(key);
  request.set_delta(delta);
  v1::StoreAddResponse response;
  if (absl::Status s = Call(kCallDeadline,
                            [&](grpc::ClientContext* context) {
                              return stub_->StoreAdd(context, request, &response);
                            });
      !s.ok()) {
    return s;
  }
  return response.value();
}

}  // namespace flatshard
