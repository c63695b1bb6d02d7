#include "coordinator/stall_watch.h"

#include <algorithm>

namespace flatshard {

void StallWatch::Observe(int rank, std::optional<uint64_t> progress, absl::Time now) {
  auto [it, first] = ranks_.try_emplace(rank, Reading{progress, now});
  if (first || !progress.has_value()) return;
  Reading& reading = it->second;
  if (reading.progress != progress) reading = {progress, now};
}

std::optional<StallWatch::Stall> StallWatch::Stalled(absl::Time now) const {
  std::optional<Stall> stalled;
  for (const auto& [rank, reading] : ranks_) {
    const absl::Duration still = now - reading.since;
    if (still >= timeout_ && (!stalled.has_value() || still > stalled->still_for)) {
      stalled = Stall{rank, still, reading.progress};
    }
  }
  return stalled;
}

absl::Duration StallWatch::probe_interval() const {
  return std::clamp(timeout_ / 10, absl::Milliseconds(10), absl::Seconds(2));
}

}  // namespace flatshard
