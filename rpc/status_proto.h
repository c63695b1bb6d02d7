// absl::Status as data inside a message (flatshard.v1.Status), for outcomes
// that are results rather than RPC failures: a rank that could not write its
// checkpoint file but stayed in sequence. The one pair of conversions.
#ifndef FLATSHARD_RPC_STATUS_PROTO_H_
#define FLATSHARD_RPC_STATUS_PROTO_H_

#include "absl/status/status.h"

#include "flatshard/v1/worker.pb.h"

namespace flatshard {

v1::Status StatusToProto(const absl::Status& status);
// Code 0 is OK. A code absl does not define becomes UNKNOWN, naming it.
absl::Status StatusFromProto(const v1::Status& status);

}  // namespace flatshard

#endif  // FLATSHARD_RPC_STATUS_PROTO_H_
