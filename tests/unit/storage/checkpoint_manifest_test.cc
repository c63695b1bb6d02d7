// Checkpoint manifests (storage/checkpoint_manifest.h, docs/architecture.md §6): they
// round-trip, malformed ones are refused naming the field, and checkpoint
// names cannot escape the checkpoint root or collide with its bookkeeping.
#include "storage/checkpoint_manifest.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace flatshard {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

CheckpointManifest Sample() {
  CheckpointManifest m;
  m.name = "step-00000010";
  m.job = "mlp";
  m.job_spec.set_name("mlp");
  m.job_spec.set_world_size(4);
  m.job_spec_digest = JobSpecDigest(m.job_spec);
  m.step = 10;
  m.data_position = 20;
  m.state_dict_type = v1::SHARDED_STATE_DICT;
  m.world_size = 4;
  m.strategy = "FULL_SHARD";
  m.params["fc.weight"] = {DType::kFloat32, {8, 4}};
  m.params["fc.bias"] = {DType::kBFloat16, {8}};
  m.tied["head.weight"] = "fc.weight";
  m.optimizer = "adamw";
  m.optimizer_states = {"exp_avg", "exp_avg_sq"};
  m.data_seed = 7;
  m.global_batch_size = 32;
  m.init_seed = 3;
  m.created_unix_micros = 123;
  m.files = {{"model-rank00000-of-00004.safetensors", 0, 100, "00112233aabbccdd", {}}};
  return m;
}

TEST(CheckpointManifestTest, RoundTrips) {
  const CheckpointManifest m = Sample();
  absl::StatusOr<CheckpointManifest> back = ParseManifest(ManifestToJson(m), "manifest.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->name, m.name);
  EXPECT_EQ(back->step, 10);
  EXPECT_EQ(back->data_position, 20);
  EXPECT_EQ(back->state_dict_type, v1::SHARDED_STATE_DICT);
  EXPECT_EQ(back->params.at("fc.bias").dtype, DType::kBFloat16);
  EXPECT_EQ(back->params.at("fc.weight").shape, (std::vector<int64_t>{8, 4}));
  EXPECT_EQ(back->tied.at("head.weight"), "fc.weight");
  EXPECT_EQ(back->optimizer_states, m.optimizer_states);
  EXPECT_EQ(back->files.at(0).xxh3, "00112233aabbccdd");
  EXPECT_EQ(back->job_spec.world_size(), 4);
  EXPECT_EQ(JobSpecDigest(back->job_spec), m.job_spec_digest);
  EXPECT_EQ(back->converted_from, "");
}

// A converted copy names its source; a save's manifest has no such field
// (what versions before it wrote, and still read).
TEST(CheckpointManifestTest, ACopyNamesItsSource) {
  CheckpointManifest m = Sample();
  EXPECT_FALSE(nlohmann::json::parse(ManifestToJson(m)).contains("converted_from"));
  m.converted_from = "step-00000009";
  absl::StatusOr<CheckpointManifest> back = ParseManifest(ManifestToJson(m), "manifest.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->converted_from, "step-00000009");
  nlohmann::json json = nlohmann::json::parse(ManifestToJson(m));
  json["converted_from"] = 9;
  EXPECT_THAT(std::string(ParseManifest(json.dump(), "m.json").status().message()),
              HasSubstr("'converted_from' has the wrong type"));
}

// A FULL file every rank wrote part of: each entry lists its regions, each
// with its hash, and together they tile the file.
CheckpointManifest WithSharedFile(
    const std::vector<std::vector<std::pair<uint64_t, uint64_t>>>& parts) {
  CheckpointManifest m = Sample();
  m.state_dict_type = v1::FULL_STATE_DICT;
  m.files.clear();
  for (size_t r = 0; r < parts.size(); ++r) {
    CheckpointFile f{"model.safetensors", static_cast<int>(r), 100, "", {}};
    for (const auto& [offset, bytes] : parts[r]) {
      f.regions.push_back({offset, bytes, absl::StrCat("00000000000000", r, offset % 10)});
    }
    m.files.push_back(std::move(f));
  }
  return m;
}

TEST(CheckpointManifestTest, FilesSeveralRanksWroteRoundTripWithTheirRegions) {
  const CheckpointManifest m = WithSharedFile({{{0, 40}, {70, 30}}, {{40, 30}}});
  const std::string json = ManifestToJson(m);
  EXPECT_THAT(json, Not(HasSubstr("\"xxh3\"")));  // a region entry has no whole-file hash
  absl::StatusOr<CheckpointManifest> back = ParseManifest(json, "manifest.json");
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->files.size(), 2u);
  EXPECT_EQ(back->files[0].regions, m.files[0].regions);
  EXPECT_EQ(back->files[1].regions, m.files[1].regions);
  EXPECT_EQ(back->files[1].regions.at(0).xxh3, "0000000000000010");
  EXPECT_EQ(back->files[1].rank, 1);
  EXPECT_EQ(CheckpointBytes(*back), 100u);  // one file, however many wrote it
}

TEST(CheckpointManifestTest, RefusesRegionsThatDoNotTileTheirFile) {
  auto refused = [](const CheckpointManifest& m) {
    return std::string(ParseManifest(ManifestToJson(m), "m.json").status().message());
  };
  EXPECT_THAT(refused(WithSharedFile({{{0, 40}}, {{50, 50}}})),
              HasSubstr("bytes from 40 are nobody's"));
  EXPECT_THAT(refused(WithSharedFile({{{0, 60}}, {{50, 50}}})), HasSubstr("listed twice"));
  // Sizes that would wrap past 2^64 back onto the file are refused too.
  EXPECT_THAT(refused(WithSharedFile({{{0, 50}}, {{50, UINT64_MAX - 10}}})),
              HasSubstr("past its end"));
  EXPECT_THAT(refused(WithSharedFile({{{0, 40}}, {{40, 50}}})), HasSubstr("end at byte 90 of 100"));
  EXPECT_THAT(refused(WithSharedFile({{{70, 30}, {0, 40}}, {{40, 30}}})),
              HasSubstr("out of file order"));
  CheckpointManifest sizes = WithSharedFile({{{0, 40}}, {{40, 60}}});
  sizes.files[1].bytes = 120;
  EXPECT_THAT(refused(sizes), HasSubstr("sizes 100 and 120"));
  CheckpointManifest whole = WithSharedFile({{{0, 40}}, {{40, 60}}});
  whole.files[1].regions.clear();
  whole.files[1].xxh3 = "0011223344556677";
  EXPECT_THAT(refused(whole), HasSubstr("without the regions it wrote"));
  nlohmann::json bad = nlohmann::json::parse(ManifestToJson(WithSharedFile({{{0, 100}}})));
  bad["files"][0]["regions"][0] = {0, 100};  // no hash
  EXPECT_THAT(std::string(ParseManifest(bad.dump(), "m.json").status().message()),
              HasSubstr("'regions' has the wrong type"));
}

TEST(CheckpointManifestTest, RefusesMalformedManifestsNamingTheField) {
  auto with = [](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json json = nlohmann::json::parse(ManifestToJson(Sample()));
    edit(json);
    return ParseManifest(json.dump(), "m.json").status();
  };
  EXPECT_THAT(std::string(ParseManifest("{", "m.json").status().message()),
              HasSubstr("not a JSON object"));
  EXPECT_THAT(std::string(with([](auto& j) { j.erase("step"); }).message()),
              HasSubstr("missing field 'step'"));
  EXPECT_THAT(std::string(with([](auto& j) { j["step"] = "ten"; }).message()),
              HasSubstr("'step' has the wrong type"));
  // A job orders its histories by it and stamps later saves after it.
  EXPECT_THAT(std::string(with([](auto& j) { j["created_unix_micros"] = INT64_MAX; }).message()),
              HasSubstr("created_unix_micros 9223372036854775807 is not a time"));
  EXPECT_THAT(std::string(with([](auto& j) { j["created_unix_micros"] = -1; }).message()),
              HasSubstr("created_unix_micros -1 is not a time"));
  EXPECT_THAT(std::string(with([](auto& j) { j["format_version"] = 99; }).message()),
              HasSubstr("format_version 99"));
  EXPECT_THAT(std::string(with([](auto& j) { j["state_dict_type"] = "HALF"; }).message()),
              HasSubstr("unknown state dict type"));
  EXPECT_THAT(
      std::string(with([](auto& j) { j["files"][0]["name"] = "../../etc/passwd"; }).message()),
      HasSubstr("not a plain file name"));
  EXPECT_THAT(std::string(with([](auto& j) { j["world_size"] = 0; }).message()),
              HasSubstr("world_size must be positive"));
  // A load stages each optimizer state once (a second would free the first
  // with reads still due into it).
  EXPECT_THAT(std::string(with([](auto& j) {
                            j["optimizer_states"] = {"exp_avg", "exp_avg_sq", "exp_avg"};
                          }).message()),
              HasSubstr("optimizer_states lists 'exp_avg' twice"));
}

TEST(CheckpointManifestTest, NamesStayInsideTheRoot) {
  EXPECT_TRUE(ValidateCheckpointName("step-00000010").ok());
  EXPECT_TRUE(ValidateCheckpointName("before_lr.decay-2").ok());
  for (const char* bad : {"", "..", "../x", "a/b", ".hidden", "x.partial", "x.tmp", "latest",
                          "sp ace", "semi;colon"}) {
    EXPECT_EQ(ValidateCheckpointName(bad).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_FALSE(ValidateCheckpointName(std::string(129, 'a')).ok());
}

TEST(CheckpointManifestTest, FileNamesAndTypes) {
  EXPECT_EQ(RankFileName("model", 2, 4), "model-rank00002-of-00004.safetensors");
  EXPECT_EQ(*ParseStateDictType("sharded"), v1::SHARDED_STATE_DICT);
  EXPECT_EQ(*ParseStateDictType("LOCAL_STATE_DICT"), v1::LOCAL_STATE_DICT);
  EXPECT_FALSE(ParseStateDictType("half").ok());
}

}  // namespace
}  // namespace flatshard
