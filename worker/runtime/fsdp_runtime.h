// The FSDP data plane of one worker: its units (FlatParamUnit), process groups,
// streams and optimizer state on its Device, and the execution of a step program
// (core/step_program.h) against the model's forward and backward. The model's
// hooks fire at every module; at a unit's module the runtime checks that the
// program expects that marker and runs the program's ops up to the next one
// (unshard, prefetch, reshard, reduce), so what runs is exactly what the
// coordinator compiled and every rank issues the same collectives in the same
// order.
//
// One runtime for every device (docs/architecture.md §5): work is issued from
// the calling thread onto two streams. Compute (the model, the optimizer) runs
// on the compute stream; all-gathers and gradient reductions on the
// communication stream, which runs ahead (prefetch) or behind (reductions) and
// overlaps compute. Every cross-stream use is an explicit event wait: compute
// waits for a unit's gather event before its parameters are used, the
// communication stream waits for the backward before a reduction and for the
// compute stream once per step before gathering shards the optimizer updated;
// every buffer is released on the stream of its last use. The simulated device
// checks all of it.
#ifndef FLATSHARD_WORKER_RUNTIME_FSDP_RUNTIME_H_
#define FLATSHARD_WORKER_RUNTIME_FSDP_RUNTIME_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

#include "core/model_spec.h"
#include "core/optimizer.h"
#include "core/sharding.h"
#include "core/step_program.h"
#include "core/wrap_policy.h"
#include "storage/file_system.h"
#include "worker/comm/communicator.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/store.h"
#include "worker/compute/batch.h"
#include "worker/compute/model.h"
#include "worker/device/device.h"
#include "worker/device/memory_tracker.h"
#include "worker/runtime/device_optimizer_state.h"
#include "worker/runtime/flat_param_unit.h"
#include "worker/runtime/runtime_groups.h"
#include "worker/runtime/runtime_observer.h"

namespace flatshard {

// What one worker's runtime needs: the job's sharding and optimizer settings,
// held as they are (core/job_config.h), plus what only a running worker has.
// RuntimeOptionsFromJob (worker/service/job_options.h) builds it from a job.
struct RuntimeOptions {
  ShardingSettings sharding;
  OptimizerSettings optimizer;
  uint64_t seed = 0;  // parameter initialisation
  compute::LossKind loss = compute::LossKind::kMse;
  // The device to compute on (worker/device/device_factory.h); a CPU device when
  // unset. Shared: a worker keeps one device across the job's re-formations.
  std::shared_ptr<Device> device;
  // Collectives for device memory: auto is NCCL on cuda, Gloo elsewhere.
  CommBackend comm = CommBackend::kAuto;
  GlooOptions gloo;
  // Metrics: collectives, unshards, reshards, steps. Must outlive the runtime.
  RuntimeObserver* observer = nullptr;
  // Where checkpoint files are written (null: FileSystem::Default()); the
  // fault-injection tests give one that fails. Must outlive the runtime.
  FileSystem* file_system = nullptr;
  // Connect a communicator for in-memory peer snapshot exchanges
  // (checkpoints.in_memory_every_steps > 0).
  bool peer_snapshots = false;
  // Tests only: leaves out one of the runtime's event waits, to show that the
  // simulated device catches the race (never set outside those tests).
  enum class DroppedWait { kNone, kGather, kBackward, kSnapshot };
  DroppedWait testing_dropped_wait = DroppedWait::kNone;
};

// summon_full_params (docs/fsdp-semantics.md §5.5).
struct SummonOptions {
  bool writeback = true;        // copy the caller's changes back into the shards
  bool rank0_only = false;      // other ranks get nothing (and free at once)
  bool offload_to_cpu = false;  // host memory already: accepted, a no-op here
  bool with_grads = false;      // also the full gradients (use_orig_params only)
};

struct SummonedParams {
  std::map<std::string, std::vector<float>> params;  // by FQN, tied aliases included
  std::map<std::string, std::vector<float>> grads;   // with_grads; empty if none yet
};

struct StepStats {
  double loss = 0.0;        // this rank's mean loss on its local batch
  double grad_norm = -1.0;  // total norm before clipping, when clipping ran
  double compute_seconds = 0.0;
  double exposed_comm_seconds = 0.0;  // the compute stream waiting on the communication stream
  double optimizer_seconds = 0.0;
};

class FsdpRuntime : public compute::ParamResolver, public compute::ModuleHooks {
 public:
  // Builds units and layouts, connects the communicators through `store` (all
  // ranks call it), and initialises parameters deterministically from the seed.
  static absl::StatusOr<std::unique_ptr<FsdpRuntime>> Create(const ModelSpec& spec,
                                                             const WrapPolicy& policy,
                                                             const RuntimeOptions& options,
                                                             int rank, int world_size,
                                                             const std::shared_ptr<Store>& store);
  ~FsdpRuntime() override;

  // The program of one step (sync_gradients = false for a no_sync micro-step),
  // compiled from the job's settings as the coordinator compiles it.
  StepProgram CompileProgram(bool sync_gradients) const;

  // Runs `program` on the local batch: forward, backward and the ops around them.
  absl::StatusOr<StepStats> RunStep(const StepProgram& program, const compute::Batch& batch);

  // Runs control commands outside a step (manual Unshard / Reshard by unit,
  // Barrier), in order; a unit left unsharded stays so until a Reshard or the
  // next step's program reshards it. INVALID_ARGUMENT for any other command.
  absl::Status RunControl(const StepProgram& program);

  // Fails every pending and future collective of this runtime (its
  // communicators'), from any thread: a peer died or the coordinator failed
  // the step. The runtime is unusable afterwards; the job is re-formed.
  void Abort(const std::string& reason);
  // Whether Abort was called: what has no collective to fail (a sync save's
  // writes, a load's reads and hashing) checks it before each chunk, so an
  // aborted save or load lets go within one chunk's I/O
  // (worker/service/abort_watchdog.h counts on that).
  bool aborted() const { return aborted_.load(std::memory_order_relaxed); }

  // Work moved on: a step's command or module marker ran, a checkpoint chunk
  // was written or read. Waiting (for a peer, a disk) does not count, so a
  // counter that stays still while other ranks finished their batch means
  // this one is stuck (GetStatusResponse.progress; the coordinator's stall
  // detector). Any thread.
  void NoteProgress() { progress_.fetch_add(1, std::memory_order_relaxed); }
  uint64_t progress() const { return progress_.load(std::memory_order_relaxed); }

  // Every parameter's full fp32 value by FQN (tied aliases included), gathered
  // unit by unit. A collective: all ranks call it.
  absl::StatusOr<std::map<std::string, std::vector<float>>> SummonFullParams();

  // The context-manager form: gathers, hands the values (and grads) to `body`,
  // then writes the params back into the shards if `writeback`. Errors for the
  // option combinations FSDP rejects (docs/fsdp-semantics.md §5.5, §10), naming the option.
  absl::Status SummonFullParams(const SummonOptions& options,
                                const std::function<absl::Status(SummonedParams&)>& body);

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  const std::vector<std::unique_ptr<FlatParamUnit>>& units() const { return units_; }
  const MemoryTracker& memory() const { return memory_; }
  MemoryTracker& memory() { return memory_; }
  // Largest number of non-root units unsharded at once since the last reset.
  int peak_live_units() const { return peak_live_units_; }
  const ModelIndex& index() const { return index_; }
  const RuntimeOptions& options() const { return options_; }
  Device& device() const { return *device_; }
  // The peer snapshot exchanges' world group (null unless options().peer_snapshots).
  Communicator* snapshot_comm() { return groups_.snapshot.get(); }
  // The whole world over host memory (a peer snapshot restore broadcasts on it).
  Communicator* host_world_comm() { return groups_.host_world.get(); }
  // The shard group for host memory: what synchronous saves gather over.
  Communicator* host_shard_comm() { return groups_.host_shard_group(); }
  // The host groups copy between this host's ranks directly (RuntimeGroups).
  bool same_host_collectives() const { return groups_.same_host; }

  // Waits for both streams: afterwards host code may read and write the
  // shards and optimizer state through the units' and the methods' host views.
  absl::Status SynchronizeStreams();
  // Unit `unit`'s optimizer state as core's host type (checkpoints save it), and
  // its replacement by host values (checkpoints load them; see
  // DeviceOptimizerState::FromHost). The streams must be idle.
  absl::StatusOr<std::unique_ptr<OptimizerState>> ReadOptimizerState(size_t unit) const;
  absl::Status WriteOptimizerState(size_t unit, std::map<std::string, StagedFloats> states,
                                   float step);
  std::vector<std::string> OptimizerStateNames(size_t unit) const {
    return optim_states_[unit]->StateNames();
  }
  double OptimizerStep(size_t unit) const { return optim_states_[unit]->step(); }
  // One state tensor of unit `unit` copied once into pinned host memory by
  // `stream` (a save's snapshot; BeginSnapshotCopies orders it).
  absl::StatusOr<PinnedBuffer> CopyOptimizerStateToPinned(size_t unit, const std::string& name,
                                                          Stream& stream) const {
    return optim_states_[unit]->CopyToPinned(name, stream);
  }
  // One state tensor of unit `unit` where it lives on the device.
  absl::StatusOr<DeviceSpan<const float>> OptimizerStateTensor(size_t unit,
                                                               const std::string& name) const {
    return optim_states_[unit]->Tensor(name);
  }

  // A save's snapshot copies run on a stream of their own, beside training
  // (CheckFreq's snapshot: the next forward and backward only read the
  // state, so they need not wait; the next update must). BeginSnapshotCopies
  // orders the snapshot stream after everything issued so far and returns it;
  // EndSnapshotCopies records the event the copies complete at. Until then
  // the state must not change: OptimStep makes the streams wait for that
  // event, and so does AwaitSnapshotCopies, which BatchExecutor calls before
  // every batch other than a step.
  absl::StatusOr<Stream*> BeginSnapshotCopies();
  absl::StatusOr<std::shared_ptr<Event>> EndSnapshotCopies();
  absl::Status AwaitSnapshotCopies();

  // compute::ParamResolver
  compute::ParamSlot Resolve(int param_index) override;
  // compute::ModuleHooks
  absl::Status BeforeForward(int module_index) override;
  absl::Status AfterForward(int module_index) override;
  absl::Status BeforeBackward(int module_index) override;
  absl::Status AfterBackward(int module_index) override;

 private:
  enum class UnitState { kSharded, kGathering, kUnsharded };
  struct ParamLocation {
    int unit = -1;
    int64_t offset = 0;
    int64_t numel = 0;
    bool requires_grad = true;
  };

  FsdpRuntime(const ModelSpec& spec, ModelIndex index, RuntimeOptions options, int rank,
              int world_size);
  absl::Status Build(const WrapPolicy& policy, const std::shared_ptr<Store>& store);
  absl::Status InitializeParams();

  absl::Status OnMarker(bool backward, bool done, int module_index);
  absl::Status RunUntilMarker();
  absl::Status Execute(const StepCommand& command);
  absl::Status Unshard(int unit, bool prefetch);
  absl::Status WaitGathered(int unit);
  absl::Status Reshard(int unit);
  absl::Status ReduceGrad(int unit);
  absl::Status ClipGradNorm(double max_norm, double norm_type);
  absl::Status OptimStep();
  int LiveNonRootUnits() const;
  absl::Status CheckUnit(int unit) const;
  // The compute stream waits for everything issued on the communication stream
  // so far; the wait is timed as exposed communication.
  absl::Status WaitForComm();
  // compute.Wait(event), timed as exposed communication.
  absl::Status TimedWait(const Event& event);
  // The communication stream waits for everything issued on compute so far.
  absl::Status CommWaitsForCompute();
  // The step's timings from its events, once the streams synchronized.
  absl::Status CollectTimings();

  const ModelSpec& spec_;
  ModelIndex index_;
  RuntimeOptions options_;
  int rank_;
  int world_size_;
  ShardingStrategy strategy_;
  RankLayout ranks_;
  std::vector<Unit> unit_specs_;
  std::map<int, int> unit_of_module_;
  std::vector<ParamLocation> param_locations_;

  // Declaration order is teardown order reversed: buffers (units, optimizer
  // state, the model's activations) go before the groups, the streams and the
  // device they live on.
  std::shared_ptr<Device> device_;
  std::unique_ptr<Stream> compute_;
  std::unique_ptr<Stream> comm_;
  std::unique_ptr<Stream> snapshot_;        // created by the first snapshot
  std::shared_ptr<Event> snapshot_copied_;  // copies the state must wait for
  MemoryTracker memory_;
  RuntimeGroups groups_;
  std::vector<std::unique_ptr<FlatParamUnit>> units_;
  std::vector<UnitState> states_;
  std::vector<std::unique_ptr<DeviceOptimizerState>> optim_states_;
  DeviceBuffer norm_;       // clip_grad_norm's reduced contribution, one double
  PinnedBuffer norm_host_;  // its copy for StepStats
  std::unique_ptr<compute::Model> model_;

  // Program execution state for the step in flight.
  const StepProgram* program_ = nullptr;
  size_t cursor_ = 0;
  StepStats stats_;
  // Events bracketing the step, its waits on the communication stream and the
  // optimizer: the timings are read from them once the step synchronized.
  std::shared_ptr<Event> step_start_, step_end_, optim_start_, optim_end_;
  std::atomic<bool> aborted_{false};
  std::atomic<uint64_t> progress_{0};
  std::vector<std::pair<std::shared_ptr<Event>, std::shared_ptr<Event>>> waits_;
  double clip_norm_type_ = 0.0;  // > 0 when this step clipped
  int peak_live_units_ = 0;
  // Gradients stay after OptimStep (readable by summon with_grads) and are
  // cleared when the next step starts, like zero_grad() before a forward.
  bool grads_stale_ = false;
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_RUNTIME_FSDP_RUNTIME_H_
