#include "worker/runtime/runtime_groups.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

#include "core/status_macros.h"
#include "worker/comm/background_priority.h"
#include "worker/comm/host_collectives.h"
#include "worker/comm/observed_communicator.h"
#include "worker/comm/same_host_communicator.h"
#include "worker/comm/staged_collectives.h"

#if defined(FLATSHARD_HAVE_CUDA)
#include "worker/comm/nccl_collectives.h"
#include "worker/device/cuda/cuda_device.h"
#endif

namespace flatshard {
namespace {

CollectiveObserver* ObserverOf(const GroupOptions& options, absl::string_view group) {
  return options.observer == nullptr ? nullptr : options.observer->Collectives(group);
}

}  // namespace

absl::string_view CommBackendName(CommBackend backend) {
  switch (backend) {
    case CommBackend::kAuto:
      return "auto";
    case CommBackend::kGloo:
      return "gloo";
    case CommBackend::kNccl:
      return "nccl";
  }
  return "?";
}

absl::StatusOr<CommBackend> ParseCommBackend(absl::string_view name) {
  for (CommBackend b : {CommBackend::kAuto, CommBackend::kGloo, CommBackend::kNccl}) {
    if (name == CommBackendName(b)) return b;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown communication backend '", name, "'; expected auto, gloo or nccl"));
}

absl::StatusOr<CommBackend> ResolveCommBackend(CommBackend requested, DeviceKind device) {
  if (requested == CommBackend::kAuto) {
    return device == DeviceKind::kCuda ? CommBackend::kNccl : CommBackend::kGloo;
  }
  if (requested == CommBackend::kNccl && device != DeviceKind::kCuda) {
    return absl::InvalidArgumentError(
        absl::StrCat("comm nccl needs device cuda; device ", DeviceKindName(device), " uses gloo"));
  }
  return requested;
}

void RuntimeGroups::Abort(const std::string& reason) {
  // Sub-groups first: a hybrid step may be blocked in either.
  for (Collectives* c : {replicate.get(), shard.get(), world.get()}) {
    if (c != nullptr) c->Abort(reason);
  }
  for (Communicator* c :
       {snapshot.get(), host_replicate.get(), host_shard.get(), host_world.get()}) {
    if (c != nullptr) c->Abort(reason);
  }
}

void RuntimeGroups::FlushObservations() {
  for (ObservedCollectives* o : observed) o->Flush();
}

absl::StatusOr<RuntimeGroups> ConnectRuntimeGroups(Device& device,
                                                   const std::shared_ptr<Store>& store, int rank,
                                                   int world_size, const RankLayout& ranks,
                                                   bool hybrid, const GroupOptions& options) {
  ASSIGN_OR_RETURN(const CommBackend backend, ResolveCommBackend(options.backend, device.kind()));
  RuntimeGroups g;
  // Host groups, created in the same order on every rank.
  ASSIGN_OR_RETURN(std::unique_ptr<GlooCommunicator> world,
                   GlooCommunicator::Create(store, rank, world_size, options.gloo));
  g.host_world = std::move(world);
  if (world_size > 1) {
    // Every rank takes part in the probe, opted out or not, so they agree.
    // Sub-groups inherit the outcome: they are created from host_world. Not
    // for cuda devices: their host buffers (StagedCollectives) are the
    // driver's pinned memory, which the probe does not check.
    SameHostOptions same_host = options.gloo.same_host;
    same_host.enabled = same_host.enabled && device.kind() != DeviceKind::kCuda;
    std::string why_not;
    ASSIGN_OR_RETURN(g.host_world,
                     SameHostCommunicator::Wrap(std::move(g.host_world), same_host, &why_not));
    g.same_host = why_not.empty();
    if (why_not.empty()) {
      spdlog::info("rank {}: host collectives copy between the {} ranks of this host directly",
                   rank, world_size);
    } else {
      spdlog::info("rank {}: host collectives over Gloo/TCP ({})", rank, why_not);
    }
  }
  const std::vector<int> shard_ranks = ranks.ShardGroup(rank);
  if (hybrid) {
    ASSIGN_OR_RETURN(
        g.host_shard,
        g.host_world->CreateSubgroup(shard_ranks, absl::StrCat("shard", ranks.ReplicaIndex(rank))));
    if (ranks.replicas > 1 && backend == CommBackend::kGloo) {
      ASSIGN_OR_RETURN(g.host_replicate, g.host_world->CreateSubgroup(
                                             ranks.ReplicateGroup(rank),
                                             absl::StrCat("replicate", ranks.ShardRank(rank))));
    }
  }
  if (options.peer_snapshots) {
    std::vector<int> everyone(static_cast<size_t>(world_size));
    for (int r = 0; r < world_size; ++r) everyone[static_cast<size_t>(r)] = r;
    // Its transport thread inherits a lower priority (worker/comm/background_priority.h).
    absl::StatusOr<std::unique_ptr<Communicator>> snapshot;
    RunAtBackgroundPriority([&] { snapshot = g.host_world->CreateSubgroup(everyone, "snapshot"); });
    if (!snapshot.ok()) return snapshot.status();
    g.snapshot = Observe(*std::move(snapshot), ObserverOf(options, "snapshot"));
  }

  // Device groups.
  auto observed = [&](std::unique_ptr<Collectives> c, absl::string_view group) {
    std::unique_ptr<Collectives> wrapped =
        ObserveCollectives(std::move(c), ObserverOf(options, group));
    if (auto* o = dynamic_cast<ObservedCollectives*>(wrapped.get()); o != nullptr) {
      g.observed.push_back(o);
    }
    return wrapped;
  };
  if (backend == CommBackend::kGloo) {
    const bool staged = device.kind() == DeviceKind::kCuda;
    auto borrow = [&](Communicator* comm) -> std::unique_ptr<Collectives> {
      if (staged) return StagedCollectives::Borrowing(&device, comm);
      return HostCollectives::Borrowing(comm);
    };
    g.world = observed(borrow(g.host_world.get()), "world");
    if (hybrid) {
      g.shard = observed(borrow(g.host_shard.get()), "shard");
      if (g.host_replicate != nullptr) {
        g.replicate = observed(borrow(g.host_replicate.get()), "replicate");
      }
    }
    return g;
  }
#if defined(FLATSHARD_HAVE_CUDA)
  auto* cuda_device = dynamic_cast<cuda::CudaDevice*>(&device);
  if (cuda_device == nullptr) return absl::InvalidArgumentError("comm nccl needs a cuda device");
  NcclOptions nccl;
  nccl.device = cuda_device->ordinal();
  nccl.timeout = options.gloo.timeout;
  nccl.prefix = absl::StrCat(options.gloo.prefix, "/nccl");
  nccl.abort = options.gloo.abort;
  ASSIGN_OR_RETURN(std::unique_ptr<NcclCollectives> nccl_world,
                   NcclCollectives::Create(store, rank, world_size, nccl));
  std::unique_ptr<Collectives> shard, replicate;
  if (hybrid) {
    // ncclCommSplit: every rank takes part in each split, in the same order.
    ASSIGN_OR_RETURN(shard, nccl_world->CreateSubgroup(shard_ranks, "shard"));
    if (ranks.replicas > 1) {
      ASSIGN_OR_RETURN(replicate,
                       nccl_world->CreateSubgroup(ranks.ReplicateGroup(rank), "replicate"));
    }
  }
  g.world = observed(std::move(nccl_world), "world");
  if (shard != nullptr) g.shard = observed(std::move(shard), "shard");
  if (replicate != nullptr) g.replicate = observed(std::move(replicate), "replicate");
  return g;
#else
  return absl::FailedPreconditionError("comm nccl: this flatshard was built without CUDA");
#endif
}

}  // namespace flatshard
