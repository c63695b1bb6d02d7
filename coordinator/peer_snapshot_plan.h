// Which in-memory peer snapshot a recovery restores, and who sends what
// (docs/fault-tolerance.md "In-memory peer snapshots"). Pure: the caller asks
// the survivors what they hold (GetStatus) and knows which snapshots it
// ordered; this picks the newest generation whose every old rank is held by
// a member of the new epoch, as that rank's own snapshot or as its ring
// successor's copy. Two adjacent ranks lost at once leave a hole, and then
// no generation qualifies: the recovery falls back to a checkpoint.
#ifndef FLATSHARD_COORDINATOR_PEER_SNAPSHOT_PLAN_H_
#define FLATSHARD_COORDINATOR_PEER_SNAPSHOT_PLAN_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "flatshard/v1/worker.pb.h"

namespace flatshard {

// A snapshot the coordinator ordered and every rank took.
struct PeerSnapshotMark {
  int world_size = 0;
  int64_t data_position = 0;  // global batches consumed at that step
};
// By (epoch, step).
using PeerSnapshotMarks = std::map<std::pair<uint64_t, int64_t>, PeerSnapshotMark>;

struct PeerSnapshotChoice {
  uint64_t epoch = 0;
  int64_t step = 0;
  int from_world_size = 0;
  int64_t data_position = 0;
  std::vector<int> holder;  // holder[k]: the new rank that sends old rank k's snapshot
  int copies_used = 0;      // old ranks restored from a neighbour's copy
};

// `members` are the new epoch's worker ids by rank; `held` what each of them
// reported holding (for `job`). Only generations newer than `newer_than`
// (the step a checkpoint would restore; -1: none) are worth restoring.
std::optional<PeerSnapshotChoice> ChoosePeerSnapshot(
    const std::string& job, const std::vector<std::string>& members,
    const std::map<std::string, std::vector<v1::PeerSnapshotHeld>>& held,
    const PeerSnapshotMarks& marks, int64_t newer_than);

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_PEER_SNAPSHOT_PLAN_H_
