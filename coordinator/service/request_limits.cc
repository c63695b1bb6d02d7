#include "coordinator/service/request_limits.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace flatshard {

RequestLimits::StreamSlot::~StreamSlot() {
  if (limits_ == nullptr) return;
  std::lock_guard<std::mutex> lock(limits_->mu_);
  if (--limits_->streams_[client_] <= 0) limits_->streams_.erase(client_);
}

absl::StatusOr<RequestLimits::StreamSlot> RequestLimits::AdmitStream(const std::string& client,
                                                                     absl::string_view call) {
  std::lock_guard<std::mutex> lock(mu_);
  int& open = streams_[client];
  if (open >= settings_.max_streams_per_client) {
    return absl::ResourceExhaustedError(absl::StrCat(
        call, ": limit streams_per_client (", settings_.max_streams_per_client,
        ", --max-streams-per-client) reached for '", client, "'; end a watch or a stream first"));
  }
  ++open;
  return StreamSlot(this, client);
}

absl::Status RequestLimits::AdmitExpensive(const std::string& client, absl::string_view call,
                                           absl::Time now) {
  const double capacity = settings_.expensive_calls_per_minute;
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, fresh] = buckets_.try_emplace(client, Bucket{capacity, now});
  Bucket& bucket = it->second;
  if (!fresh) {
    const double refill = absl::ToDoubleMinutes(now - bucket.refilled) * capacity;
    bucket.tokens = std::min(capacity, bucket.tokens + std::max(refill, 0.0));
    bucket.refilled = now;
  }
  if (bucket.tokens < 1) {
    return absl::ResourceExhaustedError(absl::StrCat(
        call, ": limit expensive_calls_per_minute (", settings_.expensive_calls_per_minute,
        ", --expensive-calls-per-minute) reached for '", client,
        "' (Plan, SummonFullParams and SaveCheckpoint share it); retry in a few seconds"));
  }
  bucket.tokens -= 1;
  return absl::OkStatus();
}

}  // namespace flatshard
