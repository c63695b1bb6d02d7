#include "coordinator/service/audit_rate_limit.h"

#include <algorithm>

namespace flatshard {

AuditRateLimit::AuditRateLimit(double lines_per_second, double burst)
    : lines_per_second_(lines_per_second), burst_(burst), tokens_(burst) {}

std::optional<int64_t> AuditRateLimit::Admit(absl::Time now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (last_ != absl::InfinitePast() && now > last_) {
    tokens_ = std::min(burst_, tokens_ + absl::ToDoubleSeconds(now - last_) * lines_per_second_);
  }
  last_ = std::max(last_, now);
  if (tokens_ < 1) {
    ++not_written_;
    return std::nullopt;
  }
  tokens_ -= 1;
  const int64_t before = not_written_;
  not_written_ = 0;
  return before;
}

int64_t AuditRateLimit::TakeNotWritten() {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t before = not_written_;
  not_written_ = 0;
  return before;
}

}  // namespace flatshard
