// Ranks that travel with an absl::Status, as payloads: what the code that
// handles a failure acts on, where the message says the same for people.
// Payloads survive re-prefixing with PrefixStatus and cross gRPC calls
// (proto/grpc_status.h).
//
// - FailedRank: the rank a failed batch is blamed on. A recovery that
//   re-forms the job needs to know whether a newcomer (a spare, a worker it
//   grows back onto) broke the new epoch's first batches, so that its next
//   try can pass that worker over.
// - UnreachablePeer: the rank (of the job's world) that a rank could not
//   connect to while its communicator formed, or whose connection to it
//   failed later (closed, reset: the peer exited). Such a failure is not the
//   reporting rank's own: either end may be at fault, or neither (a port
//   the kernel handed to another listener), and the coordinator blames it
//   accordingly (coordinator/link_failures.h).
#ifndef FLATSHARD_CORE_STATUS_PAYLOADS_H_
#define FLATSHARD_CORE_STATUS_PAYLOADS_H_

#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace flatshard {

// `status` (not OK) blamed on `rank` of the epoch that ran the batch.
absl::Status WithFailedRank(absl::Status status, int rank);
// The rank `status` is blamed on, if any.
std::optional<int> FailedRank(const absl::Status& status);

// `status` (not OK) of a rank whose link to world rank `peer` did not
// connect or failed.
absl::Status WithUnreachablePeer(absl::Status status, int peer);
// The world rank `status` says could not be reached, if any.
std::optional<int> UnreachablePeer(const absl::Status& status);

// `status` with `prefix` before its message, its code and payloads kept.
absl::Status PrefixStatus(absl::string_view prefix, const absl::Status& status);

}  // namespace flatshard

#endif  // FLATSHARD_CORE_STATUS_PAYLOADS_H_
