// The central data-plane test (docs/architecture.md §9): W real worker processes training
// the 1M-parameter, 5-unit MLP (examples/mlp.yaml) over Gloo match single-process
// unsharded training on the same global batch, step for step, under every
// strategy (hybrid as 2x2), with and without use_orig_params padding and with
// backward prefetch PRE / POST / NONE (docs/fsdp-semantics.md §2.5, §3.4, §9.2). Also bf16
// params and reduction, no_sync accumulation, clip-grad-norm across shards
// (§8) and the limit_all_gathers memory bound (§9.3). Every configuration runs
// on the CPU device and again on the strict simulated device (docs/architecture.md
// §5), whose streams run asynchronously and which refuses any buffer use the
// runtime did not order with an event: the GPU path's evidence without a GPU.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <limits>

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"

#include "core/model_spec_yaml.h"
#include "core/plan.h"
#include "tests/integration/multiprocess.h"
#include "tests/integration/rank_results.h"
#include "tests/integration/reference_trainer.h"
#include "worker/comm/file_store.h"
#include "worker/compute/data_source.h"
#include "worker/device/device_factory.h"
#include "worker/runtime/runtime_groups.h"

#if defined(FLATSHARD_HAVE_CUDA)
#include "worker/device/cuda/cuda_status.h"
#endif
#include "storage/spec_files.h"
#include "worker/runtime/local_trainer.h"

namespace flatshard {
namespace {

using testing::AllRanksSucceeded;
using testing::MakeTempDir;
using testing::RunRanks;

struct Config {
  std::string name;
  int world = 2;
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
  int hybrid = 0;
  bool use_orig_params = false;
  BackwardPrefetch prefetch = BackwardPrefetch::kPre;
  bool forward_prefetch = false;
  OptimizerKind optimizer = OptimizerKind::kAdam;
  bool bf16 = false;
  int micro_steps = 0;
  double max_grad_norm = 0;
  int steps = 20;
  double grad_norm_type = 2.0;
  DeviceKind device = DeviceKind::kCpu;
  // Every host collective, however small, copies between the ranks directly
  // (SameHostOptions::min_bytes 0), and the ranks must have taken that path.
  bool every_collective_same_host = false;
};

void PrintTo(const Config& c, std::ostream* os) { *os << c.name; }

compute::DataSourceOptions Data() {
  compute::DataSourceOptions data;
  data.kind = compute::DataKind::kRegression;
  data.global_batch_size = 16;
  data.seed = 11;
  data.input_features = 64;
  data.output_features = 16;
  return data;
}

LocalTrainOptions MakeOptions(const Config& c) {
  LocalTrainOptions o;
  auto spec = LoadModelSpecFile(std::string(FLATSHARD_SOURCE_DIR) + "/examples/mlp.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  o.spec = *spec;
  o.policy = *ParseWrapPolicy("module-type:Residual");
  ShardingSettings& sharding = o.runtime.sharding;
  sharding.strategy = c.strategy;
  sharding.hybrid_shard_group_size = c.hybrid;
  sharding.use_orig_params = c.use_orig_params;
  sharding.backward_prefetch = c.prefetch;
  sharding.forward_prefetch = c.forward_prefetch;
  if (c.bf16) {
    sharding.param_dtype = DType::kBFloat16;
    sharding.reduce_dtype = DType::kBFloat16;
  }
  OptimizerSettings& optimizer = o.runtime.optimizer;
  optimizer.kind = c.optimizer;
  optimizer.sgd = SgdOptions{0.05, 0.9};
  optimizer.adam.lr = 1e-3;
  optimizer.max_grad_norm = c.max_grad_norm;
  optimizer.grad_norm_type = c.grad_norm_type;
  o.runtime.seed = 5;
  o.runtime.gloo.timeout = absl::Seconds(60);
  if (c.every_collective_same_host) o.runtime.gloo.same_host.min_bytes = 0;
  o.data = Data();
  o.steps = c.steps;
  o.no_sync_micro_steps = c.micro_steps;
  return o;
}

// Files the ranks leave for the parent: per-step losses (every rank) and the
// final parameters (rank 0).
class FsdpEquivalenceTest : public ::testing::TestWithParam<Config> {};

// GPUs visible to this process (0 without a driver or without the CUDA build),
// asked in a child: CUDA initialised before fork() is unusable in the forked
// ranks, so the test process itself never touches it.
int VisibleGpus() {
#if defined(FLATSHARD_HAVE_CUDA)
  const pid_t pid = fork();
  if (pid == 0) _exit(std::min(cuda::CudaDeviceCount(), 100));
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return 0;
  return WEXITSTATUS(status);
#else
  return 0;
#endif
}

TEST_P(FsdpEquivalenceTest, MatchesUnshardedTraining) {
  const Config& c = GetParam();
  LocalTrainOptions options = MakeOptions(c);
  const int gpus = c.device == DeviceKind::kCuda ? VisibleGpus() : 0;
  if (c.device == DeviceKind::kCuda) {
    if (gpus == 0) GTEST_SKIP() << "no CUDA device on this machine";
    // NCCL wants a GPU per rank; ranks sharing GPUs use Gloo staged through
    // pinned memory (--comm gloo).
    options.runtime.comm = gpus >= c.world ? CommBackend::kNccl : CommBackend::kGloo;
  }
  const std::string dir = MakeTempDir("equiv");
  auto results = RunRanks(
      c.world,
      [&](int rank) {
        auto store = FileStore::Open(dir + "/store");
        if (!store.ok()) return 2;
        // The device is made in the rank's own process (its streams are threads).
        LocalTrainOptions rank_options = options;
        DeviceOptions device;
        device.kind = c.device;
        device.gpu = gpus > 0 ? rank % gpus : 0;
        device.sim.seed = static_cast<uint64_t>(rank) + 1;
        auto created = CreateDevice(device);
        if (!created.ok()) {
          std::cerr << "rank " << rank << ": " << created.status() << "\n";
          return 2;
        }
        rank_options.runtime.device = *std::move(created);
        auto result = TrainLocalRank(rank_options, rank, c.world, *store);
        if (!result.ok()) {
          std::cerr << "rank " << rank << ": " << result.status() << "\n";
          return 1;
        }
        // cuda ranks never read each other's (pinned) host buffers.
        const bool want_same_host = c.every_collective_same_host;
        if (result->same_host_collectives != want_same_host &&
            (want_same_host || c.device == DeviceKind::kCuda)) {
          std::cerr << "rank " << rank << ": host collectives "
                    << (want_same_host ? "did not take" : "took") << " the same-host path\n";
          return 3;
        }
        testing::WriteRankResult(dir, rank, *result);
        return 0;
      },
      absl::Seconds(300));
  ASSERT_TRUE(AllRanksSucceeded(results));

  // FSDP's loss per step: the mean over ranks of each rank's local mean.
  std::vector<double> fsdp_losses(static_cast<size_t>(c.steps), 0.0);
  for (int r = 0; r < c.world; ++r) {
    const std::vector<double> losses = testing::ReadRankLosses(dir, r);
    ASSERT_EQ(losses.size(), static_cast<size_t>(c.steps));
    for (size_t s = 0; s < losses.size(); ++s) fsdp_losses[s] += losses[s] / c.world;
  }

  RuntimeOptions reference_options = options.runtime;
  reference_options.sharding.param_dtype.reset();
  reference_options.sharding.reduce_dtype.reset();
  auto reference = testing::ReferenceTrainer::Create(options.spec, reference_options);
  ASSERT_TRUE(reference.ok()) << reference.status();
  auto data = compute::MakeDataSource(options.data);
  ASSERT_TRUE(data.ok()) << data.status();
  // GPU arithmetic sums in other orders (cuBLAS, CUB): a little more room.
  const double tolerance = c.bf16 ? 2e-2 : (c.device == DeviceKind::kCuda ? 1e-4 : 1e-5);
  const int per_step = c.micro_steps + 1;
  for (int s = 0; s < c.steps; ++s) {
    std::vector<compute::Batch> batches;
    for (int k = 0; k < per_step; ++k) {
      auto batch = (*data)->GetBatch(s * per_step + k, 0, 1);
      ASSERT_TRUE(batch.ok());
      batches.push_back(*std::move(batch));
    }
    auto loss = (*reference)->Step(batches);
    ASSERT_TRUE(loss.ok()) << loss.status();
    EXPECT_NEAR(fsdp_losses[static_cast<size_t>(s)], *loss, tolerance * std::fabs(*loss))
        << "step " << s;
  }
  if (c.bf16) {
    EXPECT_LT(fsdp_losses.back(), 0.8 * fsdp_losses.front()) << "bf16 training did not learn";
  }

  // Norm-wise relative error ||fsdp - ref|| / ||ref||: per parameter tensor in
  // fp32; over the whole model in bf16, where tensors with tiny norms (biases)
  // carry bf16's 2^-8 rounding in full.
  const auto fsdp_params = testing::ReadFinalParams(dir);
  const auto ref_params = (*reference)->Params();
  ASSERT_EQ(fsdp_params.size(), ref_params.size());
  double model_diff_sq = 0, model_ref_sq = 0;
  for (const auto& [fqn, want] : ref_params) {
    auto it = fsdp_params.find(fqn);
    ASSERT_NE(it, fsdp_params.end()) << fqn;
    ASSERT_EQ(it->second.size(), want.size()) << fqn;
    double diff_sq = 0, ref_sq = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const double d = double{it->second[i]} - double{want[i]};
      diff_sq += d * d;
      ref_sq += double{want[i]} * double{want[i]};
    }
    model_diff_sq += diff_sq;
    model_ref_sq += ref_sq;
    if (!c.bf16) {
      EXPECT_LE(std::sqrt(diff_sq), tolerance * std::sqrt(ref_sq)) << fqn;
    }
  }
  EXPECT_LE(std::sqrt(model_diff_sq), tolerance * std::sqrt(model_ref_sq));

  // limit_all_gathers (docs/fsdp-semantics.md §9.3): never more than two non-root units live,
  // so the tracked all-gather buffers stay within the plan's bound (the root plus
  // the two largest units) for the strategies that free after forward.
  ShardingSettings plan_sharding;
  plan_sharding.strategy = c.strategy;
  plan_sharding.hybrid_shard_group_size = c.hybrid;
  plan_sharding.use_orig_params = c.use_orig_params;
  auto plan =
      ComputePlan(options.spec, options.policy, c.world, plan_sharding, options.runtime.optimizer);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (int r = 0; r < c.world; ++r) {
    std::ifstream memory(absl::StrCat(dir, "/memory-", r));
    int64_t peak_bytes = 0;
    int peak_units = 0;
    memory >> peak_bytes >> peak_units;
    if (c.world > 1 && (c.strategy == ShardingStrategy::kFullShard ||
                        c.strategy == ShardingStrategy::kHybridShard)) {
      EXPECT_LE(peak_units, 2) << "rank " << r;
      if (!c.bf16) {  // bf16 adds fp32 compute views on top of the gathered buffers
        EXPECT_LE(peak_bytes, plan->memory_per_rank.peak_unsharded_bytes) << "rank " << r;
      }
    }
    if (c.world > 1 && c.strategy != ShardingStrategy::kNoShard) {
      EXPECT_GT(peak_bytes, 0);
    }
  }
}

using S = ShardingStrategy;
using P = BackwardPrefetch;
using O = OptimizerKind;

std::vector<Config> Configs(DeviceKind device) {
  std::vector<Config> configs = {

      Config{"w1_single_rank", 1},
      Config{"w2_full_shard_pre", 2, S::kFullShard, 0, false, P::kPre},
      Config{"w2_full_shard_post_orig", 2, S::kFullShard, 0, true, P::kPost},
      Config{"w2_full_shard_none_sgd", 2, S::kFullShard, 0, false, P::kNone, false, O::kSgd},
      Config{"w2_shard_grad_op_orig", 2, S::kShardGradOp, 0, true, P::kPost},
      Config{"w2_no_shard", 2, S::kNoShard, 0, false, P::kPre},
      Config{"w4_full_shard_pre_fwd_prefetch", 4, S::kFullShard, 0, false, P::kPre, true},
      Config{"w4_full_shard_orig_none_adamw", 4, S::kFullShard, 0, true, P::kNone, false,
             O::kAdamW},
      Config{"w4_shard_grad_op", 4, S::kShardGradOp, 0, false, P::kPre},
      Config{"w4_no_shard_orig", 4, S::kNoShard, 0, true, P::kPost},
      Config{"w4_hybrid_2x2", 4, S::kHybridShard, 2, false, P::kPre},
      Config{"w4_hybrid_2x2_orig_post", 4, S::kHybridShard, 2, true, P::kPost},
      Config{"w4_hybrid_zero2_2x2", 4, S::kHybridShardZero2, 2, false, P::kPre},
      Config{"w4_hybrid_zero2_2x2_orig", 4, S::kHybridShardZero2, 2, true, P::kNone},
      Config{"w4_clip_grad_norm", 4, S::kFullShard, 0, false, P::kPre, false, O::kAdam, false, 0,
             0.05},
      Config{"w4_clip_grad_norm_inf_hybrid", 4, S::kHybridShard, 2, false, P::kPre, false, O::kSgd,
             false, 0, 0.01, 20, std::numeric_limits<double>::infinity()},
      Config{"w2_no_sync_4_micro_steps", 2, S::kFullShard, 0, false, P::kPre, false, O::kSgd, false,
             4, 0, 4},
      Config{"w4_no_sync_shard_grad_op", 4, S::kShardGradOp, 0, true, P::kPost, false, O::kSgd,
             false, 4, 0, 4},
      Config{"w4_bf16_params_and_reduce", 4, S::kFullShard, 0, false, P::kPre, false, O::kAdam,
             true}};
  for (Config& c : configs) c.device = device;
  return configs;
}

// The CPU suite with every host collective on the same-host path (the
// runtime takes it only from SameHostOptions::min_bytes, which these models'
// units never reach): sub-groups, no_sync, clipping and bf16 included.
std::vector<Config> SameHostConfigs() {
  std::vector<Config> configs;
  for (Config c : Configs(DeviceKind::kCpu)) {
    if (c.world == 1) continue;  // one rank has no peers to read
    c.every_collective_same_host = true;
    configs.push_back(c);
  }
  return configs;
}

std::string Name(const ::testing::TestParamInfo<Config>& param_info) {
  return param_info.param.name;
}

INSTANTIATE_TEST_SUITE_P(Strategies, FsdpEquivalenceTest,
                         ::testing::ValuesIn(Configs(DeviceKind::kCpu)), Name);
INSTANTIATE_TEST_SUITE_P(SameHost, FsdpEquivalenceTest, ::testing::ValuesIn(SameHostConfigs()),
                         Name);
// ctest label `sim`: the same suite on the strict simulated device.
INSTANTIATE_TEST_SUITE_P(SimDevice, FsdpEquivalenceTest,
                         ::testing::ValuesIn(Configs(DeviceKind::kSim)), Name);
// On GPUs (scripts/gpu-check.sh); skipped where none is visible.
INSTANTIATE_TEST_SUITE_P(CudaDevice, FsdpEquivalenceTest,
                         ::testing::ValuesIn(Configs(DeviceKind::kCuda)), Name);

}  // namespace
}  // namespace flatshard
