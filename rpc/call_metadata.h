// The metadata flatshard's calls carry beside their messages: a client's
// bearer token, a worker's registration session, and the command token that
// proves a WorkerService call comes from the coordinator the worker
// registered with.
#ifndef FLATSHARD_RPC_CALL_METADATA_H_
#define FLATSHARD_RPC_CALL_METADATA_H_

#include <mutex>
#include <string>

#include <grpcpp/client_context.h>
#include <grpcpp/server_context.h>

#include "absl/strings/string_view.h"

namespace flatshard {

inline constexpr char kAuthorizationKey[] = "authorization";  // "Bearer <token>"
inline constexpr char kSessionKey[] = "x-flatshard-session";
inline constexpr char kCommandTokenKey[] = "x-flatshard-command-token";

// The first value of `key` in the call's metadata; empty when absent.
std::string MetadataValue(const grpc::ServerContext& context, absl::string_view key);

// The token of an "authorization: Bearer <token>" header; empty when absent
// or in another scheme.
std::string BearerToken(const grpc::ServerContext& context);

// What a worker attaches to its calls to the coordinator: the join token to
// Register, the session the registration returned to everything after.
// The heartbeat thread renews the session while store calls read it.
class WorkerCallCredentials {
 public:
  explicit WorkerCallCredentials(std::string join_token) : join_token_(std::move(join_token)) {}

  void set_session(std::string session);
  void AttachJoinToken(grpc::ClientContext& context) const;
  void AttachSession(grpc::ClientContext& context) const;

 private:
  const std::string join_token_;
  mutable std::mutex mu_;
  std::string session_;
};

}  // namespace flatshard

#endif  // FLATSHARD_RPC_CALL_METADATA_H_
