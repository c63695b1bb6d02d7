// Tests core/step_program.h: the compiled schedule for root{embed, block0, block1,
// head} (docs/architecture.md §4's example) under each strategy and prefetch policy
// (docs/fsdp-semantics.md §2.5, §9.2), no_sync micro-steps, and the digest.
#include "core/step_program.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_join.h"

#include "core/model_spec_yaml.h"

namespace flatshard {
namespace {

// Modules in pre-order: 0 root, 1 embed, 2 blocks, 3 blocks.0, 4 blocks.0.fc,
// 5 blocks.1, 6 blocks.1.fc, 7 head. Units: 0 root, 1 blocks.0, 2 blocks.1.
constexpr char kModel[] = R"(
root:
  type: Sequential
  children:
    - {name: embed, type: Linear, in_features: 4, out_features: 8}
    - name: blocks
      repeat: 2
      template:
        type: Residual
        children: [{name: fc, type: Linear, in_features: 8, out_features: 8}]
    - {name: head, type: Linear, in_features: 8, out_features: 2}
)";

class StepProgramTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto spec = ParseModelSpec(kModel, "m.yaml");
    ASSERT_TRUE(spec.ok()) << spec.status();
    spec_ = *std::move(spec);
    auto index = IndexModel(spec_);
    ASSERT_TRUE(index.ok());
    index_ = *std::move(index);
    auto units = ComputeUnits(index_, *ParseWrapPolicy("module-type:Residual"));
    ASSERT_TRUE(units.ok());
    units_ = *std::move(units);
    ASSERT_EQ(units_.size(), 3u);
  }

  std::string Program(const StepProgramOptions& options) const {
    std::vector<std::string> lines;
    for (const StepCommand& c : CompileStepProgram(index_, units_, options)) {
      lines.push_back(DescribeCommand(c));
    }
    return absl::StrJoin(lines, " ");
  }

  ModelSpec spec_;
  ModelIndex index_;
  std::vector<Unit> units_;
};

TEST_F(StepProgramTest, FullShardBackwardPre) {
  StepProgramOptions options;
  EXPECT_EQ(Program(options),
            "Forward(0) Unshard(0) "
            "Forward(3) Unshard(1) ForwardDone(3) Reshard(1) "
            "Forward(5) Unshard(2) ForwardDone(5) Reshard(2) "
            "ForwardDone(0) "  // the root never reshards after forward
            "Backward(0) Unshard(0) Prefetch(2) "
            "Backward(5) Unshard(2) Prefetch(1) BackwardDone(5) ReduceGrad(2) Reshard(2) "
            "Backward(3) Unshard(1) BackwardDone(3) ReduceGrad(1) Reshard(1) "
            "BackwardDone(0) ReduceGrad(0) Reshard(0) OptimStep");
}

TEST_F(StepProgramTest, BackwardPostPrefetchesAfterTheReshard) {
  StepProgramOptions options;
  options.backward_prefetch = BackwardPrefetch::kPost;
  options.forward_prefetch = true;
  options.max_grad_norm = 1.0;
  EXPECT_EQ(Program(options),
            "Forward(0) Unshard(0) Prefetch(1) "
            "Forward(3) Unshard(1) Prefetch(2) ForwardDone(3) Reshard(1) "
            "Forward(5) Unshard(2) ForwardDone(5) Reshard(2) "
            "ForwardDone(0) "
            "Backward(0) Unshard(0) "
            "Backward(5) Unshard(2) BackwardDone(5) ReduceGrad(2) Reshard(2) Prefetch(1) "
            "Backward(3) Unshard(1) BackwardDone(3) ReduceGrad(1) Reshard(1) "
            "BackwardDone(0) ReduceGrad(0) Reshard(0) "  // blocks.1 is done: no prefetch
            "ClipGradNorm(1) OptimStep");
}

TEST_F(StepProgramTest, ShardGradOpKeepsParamsUntilBackward) {
  StepProgramOptions options;
  options.strategy = ShardingStrategy::kShardGradOp;
  options.backward_prefetch = BackwardPrefetch::kNone;
  EXPECT_EQ(Program(options),
            "Forward(0) Unshard(0) Forward(3) Unshard(1) ForwardDone(3) "
            "Forward(5) Unshard(2) ForwardDone(5) ForwardDone(0) "
            "Backward(0) Unshard(0) Backward(5) Unshard(2) BackwardDone(5) ReduceGrad(2) "
            "Reshard(2) Backward(3) Unshard(1) BackwardDone(3) ReduceGrad(1) Reshard(1) "
            "BackwardDone(0) ReduceGrad(0) Reshard(0) OptimStep");
  // Inside no_sync the ZeRO-2 strategies keep params and skip the reduction.
  options.sync_gradients = false;
  EXPECT_EQ(Program(options),
            "Forward(0) Unshard(0) Forward(3) Unshard(1) ForwardDone(3) "
            "Forward(5) Unshard(2) ForwardDone(5) ForwardDone(0) "
            "Backward(0) Unshard(0) Backward(5) Unshard(2) BackwardDone(5) "
            "Backward(3) Unshard(1) BackwardDone(3) BackwardDone(0)");
}

TEST_F(StepProgramTest, NoShardOnlyReduces) {
  StepProgramOptions options;
  options.strategy = ShardingStrategy::kNoShard;
  EXPECT_EQ(Program(options),
            "Forward(0) Forward(3) ForwardDone(3) Forward(5) ForwardDone(5) ForwardDone(0) "
            "Backward(0) Backward(5) BackwardDone(5) ReduceGrad(2) Backward(3) "
            "BackwardDone(3) ReduceGrad(1) BackwardDone(0) ReduceGrad(0) OptimStep");
}

TEST_F(StepProgramTest, DigestCoversProgramStepAndSync) {
  StepProgramOptions options;
  const auto program = CompileStepProgram(index_, units_, options);
  const std::string digest = ProgramDigest(program, 3, true);
  EXPECT_EQ(digest.size(), 16u);
  EXPECT_EQ(digest, ProgramDigest(CompileStepProgram(index_, units_, options), 3, true));
  EXPECT_NE(digest, ProgramDigest(program, 4, true));
  EXPECT_NE(digest, ProgramDigest(program, 3, false));
  options.backward_prefetch = BackwardPrefetch::kNone;
  EXPECT_NE(digest, ProgramDigest(CompileStepProgram(index_, units_, options), 3, true));
}

TEST_F(StepProgramTest, OptionsForAJobComeFromItsSettings) {
  ShardingSettings sharding;
  sharding.strategy = ShardingStrategy::kShardGradOp;
  sharding.backward_prefetch = BackwardPrefetch::kPost;
  sharding.forward_prefetch = true;
  OptimizerSettings optimizer;
  optimizer.max_grad_norm = 1.5;
  optimizer.grad_norm_type = 1.0;
  const StepProgramOptions options = StepProgramOptionsFor(sharding, optimizer, 4, false);
  EXPECT_EQ(options.strategy, ShardingStrategy::kShardGradOp);
  EXPECT_EQ(options.backward_prefetch, BackwardPrefetch::kPost);
  EXPECT_TRUE(options.forward_prefetch);
  EXPECT_FALSE(options.sync_gradients);
  EXPECT_EQ(options.max_grad_norm, 1.5);
  EXPECT_EQ(options.grad_norm_type, 1.0);
  // The strategy is the effective one: a single rank runs as NO_SHARD.
  EXPECT_EQ(StepProgramOptionsFor(sharding, optimizer, 1, true).strategy,
            ShardingStrategy::kNoShard);

  // The job's settings give exactly the program of the same options by hand.
  StepProgramOptions manual;
  manual.strategy = ShardingStrategy::kShardGradOp;
  manual.backward_prefetch = BackwardPrefetch::kPost;
  manual.forward_prefetch = true;
  manual.max_grad_norm = 1.5;
  manual.grad_norm_type = 1.0;
  const StepProgram synced = CompileStepProgram(
      index_, units_, StepProgramOptionsFor(sharding, optimizer, 4, /*sync_gradients=*/true));
  EXPECT_EQ(synced, CompileStepProgram(index_, units_, manual));
  EXPECT_EQ(DescribeCommand(synced[synced.size() - 2]), "ClipGradNorm(1.5)");
}

TEST_F(StepProgramTest, EncodingIsCanonicalAndDigestsNameTheKind) {
  const StepProgram program = CompileStepProgram(index_, units_, StepProgramOptions{});
  const std::string bytes = EncodeStepProgram(program);
  EXPECT_EQ(bytes.size(), 8 + 27 * program.size());
  EXPECT_EQ(bytes, EncodeStepProgram(CompileStepProgram(index_, units_, StepProgramOptions{})));
  StepProgram changed = program;
  changed[1].unit = 2;
  EXPECT_NE(bytes, EncodeStepProgram(changed));
  // The same content under another kind has another digest.
  EXPECT_NE(BatchContentDigest("step", bytes), BatchContentDigest("control", bytes));
  EXPECT_EQ(BatchContentDigest("control", bytes).size(), 16u);
}

}  // namespace
}  // namespace flatshard
