// How many refused calls the audit trail records. A caller that proves no
// identity chooses how many refusals it makes, and each audit line is
// written and flushed (and logged): unbounded, a loop of token-less calls
// would fill the disk one line at a time. A token bucket: a burst of lines,
// then a steady rate; the refusals past it are counted, and the next line
// written says how many were not.
#ifndef FLATSHARD_COORDINATOR_SERVICE_AUDIT_RATE_LIMIT_H_
#define FLATSHARD_COORDINATOR_SERVICE_AUDIT_RATE_LIMIT_H_

#include <cstdint>
#include <mutex>
#include <optional>

#include "absl/time/time.h"

namespace flatshard {

class AuditRateLimit {
 public:
  AuditRateLimit(double lines_per_second, double burst);

  // Whether a refusal at `now` gets its line. If so: how many refusals were
  // not written since the last one that was (0 when none).
  std::optional<int64_t> Admit(absl::Time now);
  // The refusals not written since the last line that said so, for another
  // line (an allowed call's) to say; 0 after.
  int64_t TakeNotWritten();

 private:
  const double lines_per_second_;
  const double burst_;
  std::mutex mu_;
  double tokens_;                           // guarded by mu_
  absl::Time last_ = absl::InfinitePast();  // guarded by mu_
  int64_t not_written_ = 0;                 // guarded by mu_
};

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_SERVICE_AUDIT_RATE_LIMIT_H_
