#include "rpc/call_metadata.h"

#include "absl/strings/match.h"

namespace flatshard {

std::string MetadataValue(const grpc::ServerContext& context, absl::string_view key) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(grpc::string_ref(key.data(), key.size()));
  if (it == metadata.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

std::string BearerToken(const grpc::ServerContext& context) {
  const std::string value = MetadataValue(context, kAuthorizationKey);
  constexpr absl::string_view kScheme = "Bearer ";
  if (!absl::StartsWithIgnoreCase(value, kScheme)) return "";
  return value.substr(kScheme.size());
}

void WorkerCallCredentials::set_session(std::string session) {
  std::lock_guard<std::mutex> lock(mu_);
  session_ = std::move(session);
}

void WorkerCallCredentials::AttachJoinToken(grpc::ClientContext& context) const {
  if (!join_token_.empty()) context.AddMetadata(kAuthorizationKey, "Bearer " + join_token_);
}

void WorkerCallCredentials::AttachSession(grpc::ClientContext& context) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!session_.empty()) context.AddMetadata(kSessionKey, session_);
}

}  // namespace flatshard
