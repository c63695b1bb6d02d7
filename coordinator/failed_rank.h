// Which rank a failed batch is blamed on travels with its absl::Status, as a
// payload: a recovery that re-forms the job needs to know whether a newcomer
// (a spare, a worker it grows back onto) broke the new epoch's first batches,
// so that its next try can pass that worker over. The message says it too,
// for people; the payload is for the code, and survives re-prefixing with
// PrefixStatus.
#ifndef FLATSHARD_COORDINATOR_FAILED_RANK_H_
#define FLATSHARD_COORDINATOR_FAILED_RANK_H_

#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace flatshard {

// `status` (not OK) blamed on `rank` of the epoch that ran the batch.
absl::Status WithFailedRank(absl::Status status, int rank);

// The rank `status` is blamed on, if any.
std::optional<int> FailedRank(const absl::Status& status);

// `status` with `prefix` before its message, its code and payloads kept.
absl::Status PrefixStatus(absl::string_view prefix, const absl::Status& status);

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_FAILED_RANK_H_
