// The strict simulated device is the evidence that the runtime orders its
// streams correctly (docs/architecture.md §5), so it must fail a run whose
// ordering is wrong. Here the runtime is made to leave out one event wait
// (RuntimeOptions::testing_dropped_wait): the compute stream's wait for a
// unit's all-gather, or the communication stream's wait for the backward
// before a reduction. Two real worker processes train on the sim device; each
// run must fail on every rank with the device's report naming the unordered
// operations, while the same run with every wait in place trains.
#include <fstream>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

#include "core/model_spec_yaml.h"
#include "storage/spec_files.h"
#include "tests/integration/multiprocess.h"
#include "worker/comm/file_store.h"
#include "worker/device/device_factory.h"
#include "worker/runtime/local_trainer.h"

namespace flatshard {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::MakeTempDir;
using testing::RunRanks;
using Dropped = RuntimeOptions::DroppedWait;

// Trains 3 steps of the MLP at W=2, FULL_SHARD, on the sim device; returns each
// rank's error message ("" for success).
std::vector<std::string> Train(Dropped dropped) {
  LocalTrainOptions o;
  o.spec = *LoadModelSpecFile(std::string(FLATSHARD_SOURCE_DIR) + "/examples/mlp.yaml");
  o.policy = *ParseWrapPolicy("module-type:Residual");
  o.runtime.optimizer.kind = OptimizerKind::kAdam;
  o.runtime.seed = 5;
  o.runtime.gloo.timeout = absl::Seconds(30);
  o.runtime.testing_dropped_wait = dropped;
  o.data.kind = compute::DataKind::kRegression;
  o.data.global_batch_size = 8;
  o.data.input_features = 64;
  o.data.output_features = 16;
  o.steps = 3;
  o.summon_final_params = false;
  const std::string dir = MakeTempDir("sim-ordering");
  auto results = RunRanks(
      2,
      [&](int rank) {
        auto store = FileStore::Open(dir + "/store");
        DeviceOptions device;
        device.kind = DeviceKind::kSim;
        device.sim.seed = static_cast<uint64_t>(rank) + 7;
        LocalTrainOptions options = o;
        options.runtime.device = *CreateDevice(device);
        auto result = TrainLocalRank(options, rank, 2, *store);
        std::ofstream(absl::StrCat(dir, "/error-", rank))
            << (result.ok() ? "" : std::string(result.status().message()));
        return result.ok() ? 0 : 1;
      },
      absl::Seconds(120));
  std::vector<std::string> errors;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_FALSE(results[static_cast<size_t>(rank)].timed_out) << "rank " << rank << " hung";
    std::stringstream text;
    text << std::ifstream(absl::StrCat(dir, "/error-", rank)).rdbuf();
    errors.push_back(text.str());
  }
  return errors;
}

TEST(SimDeviceOrderingTest, EveryWaitInPlaceTrains) {
  for (const std::string& error : Train(Dropped::kNone)) EXPECT_EQ(error, "");
}

TEST(SimDeviceOrderingTest, ADroppedGatherWaitIsCaught) {
  for (const std::string& error : Train(Dropped::kGather)) {
    // The forward's first GEMM reads parameters the all-gather (or the cast
    // after it) wrote on the communication stream.
    EXPECT_THAT(error,
                AllOf(HasSubstr("on stream 'compute' reads buffer"), HasSubstr("on stream 'comm'"),
                      HasSubstr("without waiting for an event recorded after it")));
  }
}

TEST(SimDeviceOrderingTest, ADroppedBackwardWaitIsCaught) {
  for (const std::string& error : Train(Dropped::kBackward)) {
    // The reduction (one fused operation on the host collectives) reads the
    // unsharded gradient the backward is writing.
    EXPECT_THAT(error, AllOf(HasSubstr("ReduceGradient on stream 'comm' reads buffer"),
                             HasSubstr("on stream 'compute'"),
                             HasSubstr("without waiting for an event recorded after it")));
  }
}

}  // namespace
}  // namespace flatshard
