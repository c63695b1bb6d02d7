// Which committed checkpoint a recovery restores (docs/fault-tolerance.md,
// "Restore"). Pure: the caller lists the catalog.
//
// Not simply the newest: a job that loaded an older checkpoint left the
// history the newer ones belong to, and restoring one of those would jump
// the job forward to steps it never trained on its own history (and undo the
// load its user asked for). The ranks' history is the checkpoint it was last
// loaded from and every checkpoint whose save began after that load; before
// any load, every checkpoint.
#ifndef FLATSHARD_COORDINATOR_CHECKPOINT_HISTORY_H_
#define FLATSHARD_COORDINATOR_CHECKPOINT_HISTORY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "flatshard/v1/job.pb.h"

namespace flatshard {

struct CheckpointHistory {
  std::string loaded;             // the checkpoint last loaded ("" none)
  int64_t since_unix_micros = 0;  // when: saves begun from then on are of it
};

// The newest checkpoint of `history` in `committed` (oldest first, as the
// catalog lists them) that a world of `world_size` ranks can load (a LOCAL
// state dict only at the world size it was saved at). When `history` has
// none (the loaded one was deleted, nothing saved since), the newest of
// all: an older state of some history rather than the initialization.
std::optional<v1::CheckpointInfo> ChooseRecoveryCheckpoint(
    const std::vector<v1::CheckpointInfo>& committed, int world_size,
    const CheckpointHistory& history);

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_CHECKPOINT_HISTORY_H_
