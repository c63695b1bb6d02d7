// summon_full_params between real processes (docs/fsdp-semantics.md §5.5, §3.6): full values
// and gradients equal unsharded training's, writeback persists changes and
// writeback=false discards them, rank0_only, the rejected option combinations,
// and sync_module_states broadcasting rank 0's initial values (§7.1).
#include <cmath>
#include <iostream>

#include <gtest/gtest.h>

#include "core/model_spec_yaml.h"
#include "tests/integration/multiprocess.h"
#include "tests/integration/reference_trainer.h"
#include "worker/comm/file_store.h"
#include "worker/compute/data_source.h"
#include "worker/device/device_factory.h"

namespace flatshard {
namespace {

using testing::AllRanksSucceeded;
using testing::MakeTempDir;
using testing::RunRanks;

constexpr char kModel[] = R"(
root:
  type: Sequential
  children:
    - {name: inp, type: Linear, in_features: 6, out_features: 10}
    - name: blocks
      repeat: 3
      template:
        type: Residual
        children: [{name: fc, type: Linear, in_features: 10, out_features: 10}, {name: act, type: GELU}]
    - {name: out, type: Linear, in_features: 10, out_features: 3}
)";

double RelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
    ref += double{b[i]} * b[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(ref), 1e-30);
}

int Body(const std::string& dir, int rank, int world, DeviceKind kind) {
  static ModelSpec spec = *ParseModelSpec(kModel, "m.yaml");
  const WrapPolicy policy = *ParseWrapPolicy("module-type:Residual");
  compute::DataSourceOptions data_options;
  data_options.kind = compute::DataKind::kRegression;
  data_options.global_batch_size = 8;
  data_options.input_features = 6;
  data_options.output_features = 3;
  auto data = compute::MakeDataSource(data_options);
  CHILD_OK(data.status());
  auto store = FileStore::Open(dir);
  CHILD_OK(store.status());

  DeviceOptions device;
  device.kind = kind;
  device.sim.seed = static_cast<uint64_t>(rank) + 3;
  auto created = CreateDevice(device);
  CHILD_OK(created.status());
  RuntimeOptions options;
  options.device = *created;
  options.optimizer.kind = OptimizerKind::kSgd;
  options.optimizer.sgd.lr = 0.01;
  options.sharding.use_orig_params = true;
  options.seed = 3;
  options.gloo.prefix = "main";
  auto runtime = FsdpRuntime::Create(spec, policy, options, rank, world, *store);
  CHILD_OK(runtime.status());
  auto batch = (*data)->GetBatch(0, rank, world);
  CHILD_OK(batch.status());
  CHILD_OK((*runtime)->RunStep((*runtime)->CompileProgram(true), *batch).status());

  // Values and gradients after one step equal unsharded training's.
  auto reference = testing::ReferenceTrainer::Create(spec, options);
  CHILD_OK(reference.status());
  auto global = (*data)->GetBatch(0, 0, 1);
  CHILD_OK((*reference)->Step({*global}).status());
  const auto want_params = (*reference)->Params();
  const auto want_grads = (*reference)->Grads();
  SummonOptions with_grads;
  with_grads.writeback = false;
  with_grads.with_grads = true;
  CHILD_OK((*runtime)->SummonFullParams(with_grads, [&](SummonedParams& got) {
    for (const auto& [fqn, want] : want_params) {
      if (RelativeError(got.params[fqn], want) > 1e-5) {
        return absl::InternalError("param " + fqn + " differs");
      }
    }
    for (const auto& [fqn, want] : want_grads) {
      if (RelativeError(got.grads[fqn], want) > 1e-5) {
        return absl::InternalError("grad " + fqn + " differs");
      }
    }
    return absl::OkStatus();
  }));

  // writeback=true persists a change on every rank; writeback=false drops it.
  SummonOptions writeback;
  CHILD_OK((*runtime)->SummonFullParams(writeback, [&](SummonedParams& got) {
    for (float& v : got.params["blocks.1.fc.weight"]) v = 0.25f;
    return absl::OkStatus();
  }));
  SummonOptions discard;
  discard.writeback = false;
  CHILD_OK((*runtime)->SummonFullParams(discard, [&](SummonedParams& got) {
    for (float v : got.params["blocks.1.fc.weight"]) {
      if (v != 0.25f) return absl::InternalError("writeback did not persist");
    }
    for (float& v : got.params["blocks.1.fc.weight"]) v = -1.0f;
    return absl::OkStatus();
  }));
  auto after = (*runtime)->SummonFullParams();
  CHILD_OK(after.status());
  for (float v : (*after)["blocks.1.fc.weight"]) CHILD_CHECK(v == 0.25f);
  // Shape changes cannot be written back.
  auto shrink = (*runtime)->SummonFullParams(writeback, [&](SummonedParams& got) {
    got.params["out.bias"].pop_back();
    return absl::OkStatus();
  });
  CHILD_CHECK(std::string(shrink.message()).find("cannot writeback when the parameter shape") !=
              std::string::npos);

  // rank0_only: the others get nothing.
  SummonOptions rank0;
  rank0.writeback = false;
  rank0.rank0_only = true;
  CHILD_OK((*runtime)->SummonFullParams(rank0, [&](SummonedParams& got) {
    const bool ok = rank == 0 ? got.params.size() == want_params.size() : got.params.empty();
    return ok ? absl::OkStatus() : absl::InternalError("rank0_only delivered wrong params");
  }));
  // Rejected combinations (docs/fsdp-semantics.md §5.5); nothing is gathered for them.
  rank0.writeback = true;
  auto rejected =
      (*runtime)->SummonFullParams(rank0, [](SummonedParams&) { return absl::OkStatus(); });
  CHILD_CHECK(rejected.code() == absl::StatusCode::kUnimplemented);

  // A NO_SHARD job without use_orig_params rejects with_grads and offload_to_cpu.
  RuntimeOptions no_shard = options;
  no_shard.sharding.strategy = ShardingStrategy::kNoShard;
  no_shard.sharding.use_orig_params = false;
  no_shard.gloo.prefix = "noshard";
  auto plain = FsdpRuntime::Create(spec, policy, no_shard, rank, world, *store);
  CHILD_OK(plain.status());
  auto no_grads =
      (*plain)->SummonFullParams(with_grads, [](SummonedParams&) { return absl::OkStatus(); });
  CHILD_CHECK(std::string(no_grads.message()).find("with_grads needs use_orig_params") !=
              std::string::npos);
  SummonOptions offload;
  offload.writeback = false;
  offload.offload_to_cpu = true;
  auto no_offload =
      (*plain)->SummonFullParams(offload, [](SummonedParams&) { return absl::OkStatus(); });
  CHILD_CHECK(
      std::string(no_offload.message()).find("offload_to_cpu is not supported with NO_SHARD") !=
      std::string::npos);

  // CPUOffload: same values, master shards accounted as offloaded.
  RuntimeOptions offloaded = options;
  offloaded.sharding.cpu_offload = true;
  offloaded.gloo.prefix = "offload";
  auto host = FsdpRuntime::Create(spec, policy, offloaded, rank, world, *store);
  CHILD_OK(host.status());
  int64_t shard_bytes = 0;
  for (const auto& unit : (*host)->units()) {
    shard_bytes += static_cast<int64_t>(unit->shard().size_bytes());
  }
  CHILD_CHECK((*host)->memory().current(MemoryKind::kOffloadedParams) == shard_bytes);
  CHILD_CHECK((*host)->memory().current(MemoryKind::kShardedParams) == 0);
  auto host_values = (*host)->SummonFullParams();
  CHILD_OK(host_values.status());
  auto plain_values = (*plain)->SummonFullParams();
  CHILD_OK(plain_values.status());
  CHILD_CHECK(*host_values == *plain_values);

  // sync_module_states: every rank starts from rank 0's values even though each
  // rank's own initialisation differs.
  RuntimeOptions synced = options;
  synced.seed = 100 + static_cast<uint64_t>(rank);
  synced.sharding.sync_module_states = true;
  synced.gloo.prefix = "synced";
  auto broadcast = FsdpRuntime::Create(spec, policy, synced, rank, world, *store);
  CHILD_OK(broadcast.status());
  auto values = (*broadcast)->SummonFullParams();
  CHILD_OK(values.status());
  RuntimeOptions rank0_init = options;
  rank0_init.seed = 100;
  auto fresh = testing::ReferenceTrainer::Create(spec, rank0_init);
  CHILD_OK(fresh.status());
  for (const auto& [fqn, want] : (*fresh)->Params()) CHILD_CHECK((*values)[fqn] == want);
  return 0;
}

// On CPU workers and on simulated-GPU workers (shards in device memory, summon
// staged through pinned host buffers).
class SummonFullParamsTest : public ::testing::TestWithParam<DeviceKind> {};

TEST_P(SummonFullParamsTest, ValuesGradsWritebackAndOptions) {
  const std::string dir = MakeTempDir("summon");
  auto results = RunRanks(
      2, [&](int rank) { return Body(dir, rank, 2, GetParam()); }, absl::Seconds(120));
  EXPECT_TRUE(AllRanksSucceeded(results));
}

INSTANTIATE_TEST_SUITE_P(Devices, SummonFullParamsTest,
                         ::testing::Values(DeviceKind::kCpu, DeviceKind::kSim),
                         [](const ::testing::TestParamInfo<DeviceKind>& p) {
                           return p.param == DeviceKind::kSim ? std::string("SimDevice")
                                                              : std::string("Cpu");
                         });

}  // namespace
}  // namespace flatshard
