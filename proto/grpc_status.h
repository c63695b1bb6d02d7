// absl::Status <-> grpc::Status. The codes are the same numbers by design, so
// the mapping is one-to-one and keeps the message; the status's payloads
// travel in gRPC's binary error details (flatshard.v1.StatusDetails). Every
// service and client in flatshard converts through here.
#ifndef FLATSHARD_PROTO_GRPC_STATUS_H_
#define FLATSHARD_PROTO_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace flatshard {

grpc::Status ToGrpcStatus(const absl::Status& status);
// Details that do not parse (another server's, say) are dropped: the code
// and message still stand.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace flatshard

#endif  // FLATSHARD_PROTO_GRPC_STATUS_H_
