// The process groups one FsdpRuntime uses, connected for its device and
// communication backend (docs/architecture.md §5):
//   - host groups (Gloo over host memory): summon gathers, sync_module_states,
//     barriers (checkpoints move nothing between ranks);
//   - device groups (Collectives, ordered on the runtime's communication
//     stream): unshard all-gathers, gradient reduce-scatters and all-reduces,
//     the clip-grad-norm all-reduce.
// Backends: `gloo` runs the device groups on the host groups' Gloo contexts
// (directly for the CPU and simulated devices, staged through pinned memory
// for CUDA); `nccl` (CUDA only) connects NCCL for the device groups, split for
// the hybrid sub-groups, beside the Gloo host groups.
#ifndef FLATSHARD_WORKER_RUNTIME_RUNTIME_GROUPS_H_
#define FLATSHARD_WORKER_RUNTIME_RUNTIME_GROUPS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "core/sharding.h"
#include "worker/comm/collectives.h"
#include "worker/comm/communicator.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/observed_collectives.h"
#include "worker/comm/store.h"
#include "worker/device/device.h"
#include "worker/runtime/runtime_observer.h"

namespace flatshard {

enum class CommBackend { kAuto, kGloo, kNccl };
absl::string_view CommBackendName(CommBackend backend);  // "auto", "gloo", "nccl"
absl::StatusOr<CommBackend> ParseCommBackend(absl::string_view name);
// auto is nccl on cuda and gloo elsewhere; nccl off cuda is INVALID_ARGUMENT.
absl::StatusOr<CommBackend> ResolveCommBackend(CommBackend requested, DeviceKind device);

struct RuntimeGroups {
  std::unique_ptr<Communicator> host_world;
  std::unique_ptr<Communicator> host_shard;      // hybrid: this rank's shard group
  std::unique_ptr<Communicator> host_replicate;  // hybrid, gloo: what `replicate` runs on
  // The world again, its own context: peer snapshot exchanges run on it from a
  // background thread (GroupOptions::peer_snapshots only).
  std::unique_ptr<Communicator> snapshot;
  std::unique_ptr<Collectives> world;
  std::unique_ptr<Collectives> shard;      // hybrid only
  std::unique_ptr<Collectives> replicate;  // hybrid with more than one replica
  std::vector<ObservedCollectives*> observed;
  // The host groups copy between this host's ranks directly
  // (SameHostCommunicator), not over Gloo's TCP.
  bool same_host = false;

  // The group a unit is sharded over.
  Communicator* host_shard_group() const {
    return host_shard != nullptr ? host_shard.get() : host_world.get();
  }
  Collectives* shard_group() const { return shard != nullptr ? shard.get() : world.get(); }
  // Fails every pending and future collective of every group.
  void Abort(const std::string& reason);
  // Reports the device groups' finished collectives (after the streams synchronized).
  void FlushObservations();
};

struct GroupOptions {
  CommBackend backend = CommBackend::kAuto;
  GlooOptions gloo;
  RuntimeObserver* observer = nullptr;
  bool peer_snapshots = false;  // connect RuntimeGroups::snapshot
};

// Every rank of the world calls it, in the same order.
absl::StatusOr<RuntimeGroups> ConnectRuntimeGroups(Device& device,
                                                   const std::shared_ptr<Store>& store, int rank,
                                                   int world_size, const RankLayout& ranks,
                                                   bool hybrid, const GroupOptions& options);

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_RUNTIME_RUNTIME_GROUPS_H_
