#include "coordinator/checkpoint_history.h"

namespace flatshard {

std::optional<v1::CheckpointInfo> ChooseRecoveryCheckpoint(
    const std::vector<v1::CheckpointInfo>& committed, int world_size,
    const CheckpointHistory& history) {
  const auto loadable = [world_size](const v1::CheckpointInfo& c) {
    return c.state_dict_type() != v1::LOCAL_STATE_DICT || c.world_size() == world_size;
  };
  const auto of_history = [&history](const v1::CheckpointInfo& c) {
    return c.name() == history.loaded || c.created_unix_micros() >= history.since_unix_micros;
  };
  std::optional<v1::CheckpointInfo> newest_of_its_past;
  std::optional<v1::CheckpointInfo> newest_of_all;
  for (auto it = committed.rbegin(); it != committed.rend(); ++it) {
    if (!loadable(*it)) continue;
    if (of_history(*it)) return *it;
    // A job that never loaded one has no past before its own saves: the
    // checkpoints before them are an earlier job's, whose state it never had.
    if (history.loaded.empty()) continue;
    if (!newest_of_its_past.has_value() &&
        it->created_unix_micros() <= history.loaded_created_unix_micros &&
        it->step() <= history.loaded_step) {
      newest_of_its_past = *it;
    }
    if (!newest_of_all.has_value()) newest_of_all = *it;
  }
  return newest_of_its_past.has_value() ? newest_of_its_past : newest_of_all;
}

}  // namespace flatshard
