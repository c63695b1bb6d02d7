#include "coordinator/peer_snapshot_plan.h"

namespace flatshard {

std::optional<PeerSnapshotChoice> ChoosePeerSnapshot(
    const std::string& job, const std::vector<std::string>& members,
    const std::map<std::string, std::vector<v1::PeerSnapshotHeld>>& held,
    const PeerSnapshotMarks& marks, int64_t newer_than) {
  // Newest first.
  for (auto it = marks.rbegin(); it != marks.rend(); ++it) {
    const auto& [key, mark] = *it;
    const auto& [epoch, step] = key;
    if (step <= newer_than || mark.world_size < 1) continue;
    PeerSnapshotChoice choice{epoch,
                              step,
                              mark.world_size,
                              mark.data_position,
                              std::vector<int>(static_cast<size_t>(mark.world_size), -1),
                              0};
    std::vector<bool> own(static_cast<size_t>(mark.world_size), false);
    for (size_t r = 0; r < members.size(); ++r) {
      auto found = held.find(members[r]);
      if (found == held.end()) continue;
      for (const v1::PeerSnapshotHeld& h : found->second) {
        if (h.job() != job || h.epoch() != epoch || h.step() != step ||
            h.world_size() != mark.world_size || h.rank() < 0 || h.rank() >= mark.world_size) {
          continue;
        }
        const auto k = static_cast<size_t>(h.rank());
        // A rank's own snapshot beats a copy: it needs no exchange to have finished.
        if (choice.holder[k] < 0 || (h.own() && !own[k])) {
          choice.holder[k] = static_cast<int>(r);
          own[k] = h.own();
        }
      }
    }
    bool complete = true;
    for (size_t k = 0; k < choice.holder.size(); ++k) {
      if (choice.holder[k] < 0) complete = false;
      if (!own[k]) ++choice.copies_used;
    }
    if (complete) return choice;
  }
  return std::nullopt;
}

}  // namespace flatshard
