// A save's snapshot overlaps training (FsdpRuntime::BeginSnapshotCopies): the
// copies of the shards and optimizer state are only enqueued on the snapshot
// stream, the next step's forward and backward run beside them, and its
// update waits for them. Between real processes (W=2, Adam), on the CPU device
// (whose thread streams copy to pinned memory asynchronously) and on the strict
// simulated device: the snapshot holds, bit for bit, the state at the moment
// it was taken although the next step changed that state before the snapshot
// was read, and its files are written. With the update's wait left out
// (RuntimeOptions::testing_dropped_wait), the simulated device must report
// the optimizer writing state the snapshot stream still reads.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

#include "core/model_spec_yaml.h"
#include "core/status_macros.h"
#include "tests/integration/multiprocess.h"
#include "worker/comm/file_store.h"
#include "worker/compute/data_source.h"
#include "worker/device/device_factory.h"
#include "worker/runtime/fsdp_runtime.h"
#include "worker/runtime/shard_checkpoint.h"

namespace flatshard {
namespace {

using testing::AllRanksSucceeded;
using testing::MakeTempDir;
using testing::RunRanks;
using Dropped = RuntimeOptions::DroppedWait;

constexpr int kWorld = 2;
constexpr char kModel[] = R"(
root:
  type: Sequential
  children:
    - {name: inp, type: Linear, in_features: 6, out_features: 40}
    - name: blocks
      repeat: 2
      template:
        type: Residual
        children: [{name: fc, type: Linear, in_features: 40, out_features: 40}, {name: act, type: GELU}]
    - {name: out, type: Linear, in_features: 40, out_features: 3}
)";

absl::Status Step(FsdpRuntime& runtime, int64_t step) {
  compute::DataSourceOptions data_options;
  data_options.kind = compute::DataKind::kRegression;
  data_options.global_batch_size = 8;
  data_options.input_features = 6;
  data_options.output_features = 3;
  ASSIGN_OR_RETURN(auto data, compute::MakeDataSource(data_options));
  ASSIGN_OR_RETURN(auto batch, data->GetBatch(step, runtime.rank(), runtime.world_size()));
  return runtime.RunStep(runtime.CompileProgram(true), batch).status();
}

// Every unit's shard and optimizer tensors, read through the compute stream.
using State = std::vector<std::map<std::string, std::vector<float>>>;
absl::StatusOr<State> ReadState(FsdpRuntime& runtime) {
  State state;
  for (size_t u = 0; u < runtime.units().size(); ++u) {
    auto& unit = state.emplace_back();
    ASSIGN_OR_RETURN(unit["shard"], runtime.units()[u]->ReadShard());
    ASSIGN_OR_RETURN(std::unique_ptr<OptimizerState> optim, runtime.ReadOptimizerState(u));
    for (const std::string& name : optim->StateNames()) {
      ASSIGN_OR_RETURN(std::span<const float> values, std::as_const(*optim).State(name));
      unit[name].assign(values.begin(), values.end());
    }
  }
  return state;
}

absl::StatusOr<State> SnapshotState(const ShardSnapshot& snapshot) {
  RETURN_IF_ERROR(snapshot.copied->Synchronize());
  State state;
  for (const ShardSnapshot::Unit& u : snapshot.units) {
    auto& unit = state.emplace_back();
    ASSIGN_OR_RETURN(std::span<const float> shard, u.shard.Read<float>());
    unit["shard"].assign(shard.begin(), shard.end());
    for (const auto& [name, buffer] : u.states) {
      ASSIGN_OR_RETURN(std::span<const float> values, buffer.Read<float>());
      unit[name].assign(values.begin(), values.end());
    }
  }
  return state;
}

bool SameBits(const State& a, const State& b) {
  if (a.size() != b.size()) return false;
  for (size_t u = 0; u < a.size(); ++u) {
    if (a[u].size() != b[u].size()) return false;
    for (const auto& [name, values] : a[u]) {
      auto it = b[u].find(name);
      if (it == b[u].end() || !std::equal(values.begin(), values.end(), it->second.begin(),
                                          it->second.end(), [](float x, float y) {
                                            return std::bit_cast<uint32_t>(x) ==
                                                   std::bit_cast<uint32_t>(y);
                                          })) {
        return false;
      }
    }
  }
  return true;
}

int Body(const std::string& dir, int rank, DeviceKind kind, Dropped dropped) {
  static const ModelSpec spec = *ParseModelSpec(kModel, "m.yaml");
  auto store = FileStore::Open(dir + "/store");
  CHILD_OK(store.status());
  DeviceOptions device;
  device.kind = kind;
  device.sim.seed = static_cast<uint64_t>(rank) + 3;
  auto created = CreateDevice(device);
  CHILD_OK(created.status());
  RuntimeOptions options;
  options.device = *created;
  options.optimizer.kind = OptimizerKind::kAdam;
  options.optimizer.adam.lr = 0.01;
  options.seed = 4;
  options.testing_dropped_wait = dropped;
  auto runtime = FsdpRuntime::Create(spec, *ParseWrapPolicy("module-type:Residual"), options, rank,
                                     kWorld, *store);
  CHILD_OK(runtime.status());
  FsdpRuntime& r = **runtime;
  CHILD_OK(Step(r, 0));
  CHILD_OK(Step(r, 1));
  auto before = ReadState(r);
  CHILD_OK(before.status());
  auto snapshot = SnapshotShardCheckpoint(r, v1::SHARDED_STATE_DICT);
  CHILD_OK(snapshot.status());
  CHILD_CHECK(snapshot->copied != nullptr);
  absl::Status next = Step(r, 2);
  if (dropped == Dropped::kSnapshot) {
    // The report comes from the update (or, should the step have been
    // issued before the device noticed, the next synchronization).
    if (next.ok()) next = r.SynchronizeStreams();
    CHILD_CHECK(!next.ok());
    std::cerr << next.message() << "\n";
    CHILD_CHECK(absl::StrContains(next.message(), "still read by"));
    CHILD_CHECK(absl::StrContains(next.message(), "on stream 'snapshot'"));
    return 0;
  }
  CHILD_OK(next);
  // The step changed the state; the snapshot kept the state it was taken at.
  auto after = ReadState(r);
  CHILD_OK(after.status());
  CHILD_CHECK(!SameBits(*after, *before));
  auto snapped = SnapshotState(*snapshot);
  CHILD_OK(snapped.status());
  CHILD_CHECK(SameBits(*snapped, *before));
  // And its files are written from it.
  const std::string out = absl::StrCat(dir, "/ckpt");
  std::filesystem::create_directories(out);
  auto written = WriteShardSnapshot(*snapshot, out);
  CHILD_OK(written.status());
  CHILD_OK(written->write_status);
  CHILD_CHECK(written->files.size() == 2);  // model and optimizer
  for (const CheckpointFile& f : written->files) {
    CHILD_CHECK(std::filesystem::file_size(absl::StrCat(out, "/", f.name)) == f.bytes);
  }
  // A snapshot taken again right after (the previous one's copies are done
  // or waited for) still sees the latest state.
  CHILD_OK(r.AwaitSnapshotCopies());
  auto again = SnapshotShardCheckpoint(r, v1::SHARDED_STATE_DICT);
  CHILD_OK(again.status());
  auto again_state = SnapshotState(*again);
  CHILD_OK(again_state.status());
  CHILD_CHECK(SameBits(*again_state, *after));
  CHILD_OK(r.SynchronizeStreams());
  return 0;
}

void RunRanksOn(DeviceKind kind, Dropped dropped) {
  const std::string dir = MakeTempDir("async-snapshot");
  auto results = RunRanks(
      kWorld, [&](int rank) { return Body(dir, rank, kind, dropped); }, absl::Seconds(120));
  EXPECT_TRUE(AllRanksSucceeded(results));
}

TEST(AsyncSnapshotTest, CpuSnapshotKeepsTheStateItWasTakenAtWhileTheNextStepRuns) {
  RunRanksOn(DeviceKind::kCpu, Dropped::kNone);
}

TEST(AsyncSnapshotTest, SimDeviceSnapshotKeepsTheStateItWasTakenAtWhileTheNextStepRuns) {
  RunRanksOn(DeviceKind::kSim, Dropped::kNone);
}

TEST(AsyncSnapshotTest, SimDeviceCatchesAnUpdateThatDoesNotWaitForTheSnapshot) {
  RunRanksOn(DeviceKind::kSim, Dropped::kSnapshot);
}

}  // namespace
}  // namespace flatshard
