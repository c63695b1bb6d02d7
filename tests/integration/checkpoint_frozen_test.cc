// Checkpoints of a job with frozen parameters (use_orig_params), where one
// rank's shard of a unit holds only frozen elements and so no optimizer
// state of its own: real coordinators and worker daemons, real files. After
// a load, that rank must keep the unit's states and step as the others do,
// so that a save before the next step writes the same checkpoint the
// training would have (its step among it), a FULL save still commits, and
// training from such a save continues exactly as from the loaded one. A
// checkpoint with a unit's states but not its step is refused.
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

#include "client/flatshard_client.h"
#include "core/job_spec_yaml.h"
#include "storage/checkpoint_manifest.h"
#include "storage/checkpoint_reader.h"
#include "storage/durable_file.h"
#include "storage/safetensors_file_writer.h"
#include "storage/safetensors_reader.h"
#include "tests/integration/checkpoint_harness.h"
#include "tests/integration/multiprocess.h"

namespace flatshard {
namespace {

using checkpoint_testing::kJob;
using checkpoint_testing::Save;
using checkpoint_testing::Start;
using checkpoint_testing::Train;

// examples/mlp.yaml with its input projection frozen: the root unit's first
// 16,640 elements (input.weight, input.bias) of its 21,264, so at W=2 rank
// 0's shard of the root unit (10,632) is frozen elements only.
constexpr char kModel[] = R"(name: mlp-frozen-input
dtype: float32
root:
  type: Sequential
  children:
    - {name: input, type: Linear, in_features: 64, out_features: 256, frozen: true}
    - name: blocks
      type: ModuleList
      repeat: 2
      template:
        type: Residual
        children:
          - {name: fc1, type: Linear, in_features: 256, out_features: 512}
          - {name: act, type: GELU}
          - {name: fc2, type: Linear, in_features: 512, out_features: 256}
    - {name: norm, type: LayerNorm, normalized_shape: 256}
    - {name: output, type: Linear, in_features: 256, out_features: 16}
)";

constexpr char kJobYaml[] = R"(name: mlp-demo
model: model.yaml
wrap_policy: module-type:Residual
world_size: 2
seed: 0
sharding: {strategy: FULL_SHARD, use_orig_params: true}
optimizer: {kind: adamw, lr: 0.003, weight_decay: 0.01}
data: {kind: regression, global_batch_size: 16, seed: 1}
checkpoints: {every_steps: 0, keep_last: 0}
)";

std::vector<double> Losses(const std::vector<v1::StepResult>& steps) {
  std::vector<double> losses;
  losses.reserve(steps.size());
  for (const v1::StepResult& s : steps) losses.push_back(s.loss());
  return losses;
}

TEST(CheckpointFrozenTest, ARankWithOnlyFrozenElementsKeepsTheUnitsStateAcrossALoad) {
  const std::string dir = testing::MakeTempDir("ckpt-frozen");
  std::ofstream(dir + "/model.yaml") << kModel;
  std::ofstream(dir + "/job.yaml") << kJobYaml;
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecFile(dir + "/job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::string root = dir + "/checkpoints";
  auto cluster = Start(*spec, root);
  ASSERT_NE(cluster, nullptr);
  FlatshardClient& client = *cluster->client;
  Train(client, 3);
  ASSERT_TRUE(Save(client, "trained", v1::SHARDED_STATE_DICT).ok());

  // From the save, two steps: what training from it gives.
  ASSERT_TRUE(client.LoadCheckpoint(kJob, "trained").ok());
  const std::vector<double> want = Losses(Train(client, 2));
  ASSERT_EQ(want.size(), 2u);

  // Loaded again and saved before any step: the same checkpoint.
  ASSERT_TRUE(client.LoadCheckpoint(kJob, "trained").ok());
  absl::StatusOr<v1::CheckpointProgress> resaved = Save(client, "resaved", v1::SHARDED_STATE_DICT);
  ASSERT_TRUE(resaved.ok()) << resaved.status();
  absl::StatusOr<v1::CheckpointProgress> full = Save(client, "full", v1::FULL_STATE_DICT);
  EXPECT_TRUE(full.ok()) << full.status();
  // Rank 0's file holds the root unit's step (the 0-dim values are read
  // from it), as after the training.
  for (const char* name : {"trained", "resaved"}) {
    auto reader = CheckpointReader::Open(absl::StrCat(root, "/", kJob, "/", name));
    ASSERT_TRUE(reader.ok()) << reader.status();
    absl::StatusOr<std::vector<float>> step =
        (*reader)->ReadFull("optim", "output.weight.step", {});
    ASSERT_TRUE(step.ok()) << name << ": " << step.status();
    EXPECT_EQ((*step)[0], 3.0f) << name;
  }
  ASSERT_TRUE(client.LoadCheckpoint(kJob, "resaved").ok());
  EXPECT_EQ(Losses(Train(client, 2)), want);

  // What an earlier flatshard saved there: rank 0's optimizer file without
  // the root unit's steps, its manifest entry rewritten to match. Its states
  // without their step would restart the bias corrections at step 0: the
  // load refuses it, naming the unit, and the job keeps its state.
  const std::string stepless = absl::StrCat(root, "/", kJob, "/stepless");
  std::filesystem::copy(absl::StrCat(root, "/", kJob, "/trained"), stepless,
                        std::filesystem::copy_options::recursive);
  const std::string file = RankFileName("optim", 0, 2);
  const std::string path = absl::StrCat(stepless, "/", file);
  std::map<std::string, std::string> metadata;
  absl::StatusOr<std::string> bytes = ReadFileToString(path);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto tensors = ParseSafetensors(*bytes, &metadata);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  ASSERT_GT(std::erase_if(*tensors, [](const auto& t) { return t.first.ends_with(".step"); }), 0u);
  ASSERT_TRUE(WriteSafetensorsFile(path, *tensors, metadata).ok());
  const std::string manifest_path = absl::StrCat(stepless, "/", kManifestFileName);
  absl::StatusOr<std::string> json = ReadFileToString(manifest_path);
  ASSERT_TRUE(json.ok()) << json.status();
  absl::StatusOr<CheckpointManifest> manifest = ParseManifest(*json, manifest_path);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  manifest->name = "stepless";
  for (CheckpointFile& f : manifest->files) {
    if (f.name != file) continue;
    absl::StatusOr<FileDigest> digest = DigestFile(path);
    ASSERT_TRUE(digest.ok()) << digest.status();
    f.bytes = digest->bytes;
    f.xxh3 = digest->xxh3;
  }
  ASSERT_TRUE(WriteFileDurably(manifest_path, ManifestToJson(*manifest)).ok());
  absl::StatusOr<v1::CheckpointProgress> refused = client.LoadCheckpoint(kJob, "stepless");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::HasSubstr("has optimizer state but no '<fqn>.step'"));
  // The job goes on: the good checkpoint loads and trains as before.
  ASSERT_TRUE(client.LoadCheckpoint(kJob, "resaved").ok());
  EXPECT_EQ(Losses(Train(client, 2)), want);
}

}  // namespace
}  // namespace flatshard
