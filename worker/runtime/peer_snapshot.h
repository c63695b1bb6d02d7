// In-memory peer snapshots (docs/fault-tolerance.md "In-memory peer snapshots"):
// one rank's master shards and optimizer state at a job step, as one
// self-describing byte string. Self-describing because it may be restored at
// another world size: with each unit's shard it records which elements of
// which parameter the shard holds (docs/fsdp-semantics.md §1.4's
// ShardParamInfo), so a rank of any later layout takes exactly the elements
// its own shard needs, padding and use_orig_params alignment included.
//
// A rank keeps its own snapshot and its ring predecessor's copy (the worker
// service's PeerSnapshotStore); after a failure the survivors broadcast what
// they hold and every rank of the new epoch rebuilds its shards from it.
#ifndef FLATSHARD_WORKER_RUNTIME_PEER_SNAPSHOT_H_
#define FLATSHARD_WORKER_RUNTIME_PEER_SNAPSHOT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

#include "worker/runtime/fsdp_runtime.h"

namespace flatshard {

// Who took a snapshot, and when.
struct PeerSnapshotInfo {
  uint64_t epoch = 0;
  int64_t step = 0;
  int rank = 0;
  int world_size = 0;
  int units = 0;
};

// This rank's state now, labelled as the snapshot of `step` in `epoch`.
// Synchronizes the streams (the copies read device memory).
absl::StatusOr<std::string> CapturePeerSnapshot(FsdpRuntime& runtime, uint64_t epoch, int64_t step);

// The header of a snapshot, after checking its magic, version, length and
// checksum: DATA_LOSS naming what is wrong for a damaged one.
absl::StatusOr<PeerSnapshotInfo> ReadPeerSnapshotInfo(std::string_view bytes);

// What a restore found. `data_status` is not OK when the snapshots could not
// rebuild the state (one missing, damaged or from another model); every rank
// then leaves its state untouched, and the job falls back to a checkpoint.
struct PeerRestoreOutcome {
  absl::Status data_status;
  int64_t bytes_received = 0;
};

// Every rank of the new epoch calls it together. For old rank k of
// `from_world_size` in turn, holder[k] broadcasts the snapshot `find(k)`
// returns (null: it has none) over the host world group; every rank keeps the
// elements its shards need, and applies the result once all ranks rebuilt
// every element. A non-OK status is a collective failure (the runtime is
// then unusable).
struct PeerRestoreRequest {
  uint64_t from_epoch = 0;
  int64_t step = 0;
  int from_world_size = 0;
  std::vector<int> holder;  // holder[k]: this epoch's rank that sends old rank k's snapshot
};
absl::StatusOr<PeerRestoreOutcome> RestoreFromPeerSnapshots(
    FsdpRuntime& runtime, const PeerRestoreRequest& request,
    const std::function<std::shared_ptr<const std::string>(int old_rank)>& find);

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_RUNTIME_PEER_SNAPSHOT_H_
