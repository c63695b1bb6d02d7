#include "coordinator/stall_watch.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace flatshard {

void StallWatch::Retain(const std::vector<int>& running) {
  std::erase_if(ranks_, [&running](const auto& entry) {
    return !std::binary_search(running.begin(), running.end(), entry.first);
  });
}

void StallWatch::Observe(int rank, std::optional<uint64_t> progress, Clock::time_point now) {
  auto [it, first] = ranks_.try_emplace(rank, Reading{progress, now});
  if (first || !progress.has_value()) return;
  Reading& reading = it->second;
  if (reading.progress != progress) reading = {progress, now};
}

std::optional<StallWatch::Stall> StallWatch::Stalled(Clock::time_point now) const {
  std::optional<Stall> stalled;
  for (const auto& [rank, reading] : ranks_) {
    const absl::Duration still = absl::FromChrono(now - reading.since);
    if (still >= timeout_ && (!stalled.has_value() || still > stalled->still_for)) {
      stalled = Stall{rank, still, reading.progress};
    }
  }
  return stalled;
}

absl::Duration StallWatch::probe_interval() const {
  return std::clamp(timeout_ / 10, absl::Milliseconds(10), absl::Seconds(2));
}

std::string DescribeStall(const StallWatch::Stall& stall, absl::string_view counter) {
  return absl::StrCat("made no progress for ",
                      absl::FormatDuration(absl::Trunc(stall.still_for, absl::Milliseconds(1))),
                      stall.progress.has_value()
                          ? absl::StrCat(" (its ", counter, " stayed at ", *stall.progress, ")")
                          : std::string(" (it did not answer its progress probes)"));
}

}  // namespace flatshard
