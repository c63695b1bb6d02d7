// Which committed checkpoint a recovery restores (docs/fault-tolerance.md,
// "Restore"). Pure: the caller lists the catalog.
//
// Not simply the newest: a job that loaded an older checkpoint left the
// history the newer ones belong to, and restoring one of those would jump
// the job forward to steps it never trained on its own history (and undo the
// load its user asked for). The ranks' history is the checkpoint a client
// last loaded and every checkpoint whose save began after that load; before
// any load, every checkpoint saved since the job's creation (an earlier job
// of its name may have left others in its directory). (A recovery's or a
// grow-back's load stays on the history: it starts none.)
#ifndef FLATSHARD_COORDINATOR_CHECKPOINT_HISTORY_H_
#define FLATSHARD_COORDINATOR_CHECKPOINT_HISTORY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "flatshard/v1/job.pb.h"

namespace flatshard {

struct CheckpointHistory {
  std::string loaded;                      // the checkpoint last loaded ("" none)
  int64_t loaded_step = 0;                 // its step
  int64_t loaded_created_unix_micros = 0;  // when its save began
  // When it began (the load, or the job's creation): saves begun from then
  // on are of it. 0 (a job an earlier version created): every checkpoint is.
  int64_t since_unix_micros = 0;
};

// The newest checkpoint of `history` in `committed` (oldest first, as the
// catalog lists them) that a world of `world_size` ranks can load (a LOCAL
// state dict only at the world size it was saved at). When `history` has
// none (the loaded one was deleted, or is a LOCAL one of another world size,
// and nothing was saved since), the newest one of its past: begun before
// the loaded one, at no later step (a checkpoint begun before it at a later
// step is the future of an earlier history that a load left, not its past).
// With none of those either, the newest of all, rather than the
// initialization. A history that loaded none has no past: with none of its
// own saves loadable, nullopt (the job's initialization).
std::optional<v1::CheckpointInfo> ChooseRecoveryCheckpoint(
    const std::vector<v1::CheckpointInfo>& committed, int world_size,
    const CheckpointHistory& history);

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_CHECKPOINT_HISTORY_H_
