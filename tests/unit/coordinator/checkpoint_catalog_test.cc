// CheckpointCatalog housekeeping on real files: what a crashed save left
// (<name>.partial/) is removed at job creation, committed checkpoints and
// anything else in the job directory are not.
#include "coordinator/checkpoint_catalog.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "storage/safetensors_file_writer.h"

namespace flatshard {
namespace {

namespace fs = std::filesystem;

TEST(CheckpointCatalogTest, RemovesStalePartialsOnly) {
  const fs::path root = fs::path(::testing::TempDir()) / "catalog-partials";
  fs::remove_all(root);
  const fs::path job = root / "j";
  fs::create_directories(job / "step-00000003.partial" / "sub");
  std::ofstream(job / "step-00000003.partial" / "model-rank00000-of-00002.safetensors") << "x";
  fs::create_directories(job / "ondemand.partial");
  fs::create_directories(job / "step-00000001");  // committed
  std::ofstream(job / "notes.partial") << "a file, not a save";
  CheckpointCatalog catalog(root.string(), "j");
  EXPECT_THAT(catalog.RemoveStalePartials(),
              ::testing::UnorderedElementsAre("step-00000003", "ondemand"));
  EXPECT_FALSE(fs::exists(job / "step-00000003.partial"));
  EXPECT_FALSE(fs::exists(job / "ondemand.partial"));
  EXPECT_TRUE(fs::exists(job / "step-00000001"));
  EXPECT_TRUE(fs::exists(job / "notes.partial"));
  EXPECT_TRUE(catalog.RemoveStalePartials().empty());
  // A job directory that does not exist yet has nothing to remove.
  CheckpointCatalog fresh(root.string(), "new-job");
  EXPECT_TRUE(fresh.RemoveStalePartials().empty());
}

// Commits an empty scheduled checkpoint of `step` (no files: retention and
// `latest` are what is tested).
void CommitScheduled(CheckpointCatalog& catalog, int64_t step, int keep_last) {
  const std::string name = "step-0000000" + std::to_string(step);
  ASSERT_TRUE(catalog.BeginSave(name).ok());
  CheckpointManifest m;
  m.name = name;
  m.job = "j";
  m.step = step;
  m.scheduled = true;
  m.world_size = 1;
  m.created_unix_micros = step;  // oldest first
  auto info = catalog.Commit(m, keep_last);
  ASSERT_TRUE(info.ok()) << info.status();
}

std::vector<std::string> Names(const CheckpointCatalog& catalog) {
  std::vector<std::string> out;
  absl::StatusOr<std::vector<v1::CheckpointInfo>> all = catalog.List();
  EXPECT_TRUE(all.ok()) << all.status();
  if (!all.ok()) return out;
  for (const v1::CheckpointInfo& c : *all) out.push_back(c.name());
  return out;
}

TEST(CheckpointCatalogTest, RetentionSparesACheckpointBeingLoaded) {
  const fs::path root = fs::path(::testing::TempDir()) / "catalog-pins";
  fs::remove_all(root);
  CheckpointCatalog catalog(root.string(), "j");
  CommitScheduled(catalog, 1, /*keep_last=*/1);
  {
    const CheckpointCatalog::Pin loading(&catalog, "step-00000001");
    CommitScheduled(catalog, 2, /*keep_last=*/1);
    EXPECT_THAT(Names(catalog), ::testing::ElementsAre("step-00000001", "step-00000002"));
    EXPECT_TRUE(catalog.Read("step-00000001").ok());
  }
  CommitScheduled(catalog, 3, /*keep_last=*/1);  // unpinned: both older ones go
  EXPECT_THAT(Names(catalog), ::testing::ElementsAre("step-00000003"));
  auto latest = catalog.Read("latest");
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->name, "step-00000003");
}

// A converted copy has its source's time: of equal times, copies are listed
// first, so that the newest is the source whatever the names, and the
// checkpoint a recovery restores (the newest it can load) is not the copy.
TEST(CheckpointCatalogTest, CopiesAreListedBeforeTheirSource) {
  const fs::path root = fs::path(::testing::TempDir()) / "catalog-copies";
  fs::remove_all(root);
  CheckpointCatalog catalog(root.string(), "j");
  auto commit = [&](const std::string& name, int64_t time, const std::string& source) {
    ASSERT_TRUE(catalog.BeginSave(name).ok());
    CheckpointManifest m;
    m.name = name;
    m.job = "j";
    m.world_size = 1;
    m.created_unix_micros = time;
    m.converted_from = source;
    ASSERT_TRUE(catalog.Commit(m, 0).ok());
  };
  commit("m-save", 5, "");
  commit("z-copy", 5, "m-save");
  commit("a-copy", 5, "m-save");
  commit("earlier", 4, "");
  EXPECT_THAT(Names(catalog), ::testing::ElementsAre("earlier", "a-copy", "z-copy", "m-save"));
}

// Commit vouches only for files that are there at the size their writer
// reported, with a header that fits: a missing, truncated or headerless file
// is DATA_LOSS naming it, as are parts of a file several ranks wrote that do
// not tile it, and nothing is committed.
TEST(CheckpointCatalogTest, CommitRefusesFilesThatAreNotWhatTheirWriterReported) {
  const fs::path root = fs::path(::testing::TempDir()) / "catalog-commit";
  fs::remove_all(root);
  CheckpointCatalog catalog(root.string(), "j");
  const std::string file = "model-rank00000-of-00001.safetensors";
  // Writes the file a rank would into `name`.partial/ and returns what it reports.
  auto save = [&](const std::string& name) {
    EXPECT_TRUE(catalog.BeginSave(name).ok());
    const std::string path = (root / "j" / (name + ".partial") / file).string();
    auto writer = SafetensorsFileWriter::Create(path, {{"w", DType::kFloat32, {16}}});
    EXPECT_TRUE(writer.ok()) << writer.status();
    EXPECT_TRUE((*writer)->Append("w", std::vector<float>(16, 1.0f)).ok());
    absl::StatusOr<FileDigest> digest = (*writer)->Finish();
    CheckpointManifest m;
    m.name = name;
    m.job = "j";
    m.world_size = 1;
    m.files = {{file, 0, digest->bytes, digest->xxh3, {}}};
    return std::make_pair(m, path);
  };
  auto [good, good_path] = save("good");
  ASSERT_TRUE(catalog.Commit(good, 0).ok());

  auto [missing, missing_path] = save("missing");
  fs::remove(missing_path);
  auto [truncated, truncated_path] = save("truncated");
  fs::resize_file(truncated_path, fs::file_size(truncated_path) - 4);
  auto [lying, lying_path] = save("lying");
  lying.files[0].bytes += 4;
  // Reported as two ranks' parts of the file, with a gap between them.
  auto [gap, gap_path] = save("gap");
  const uint64_t size = gap.files[0].bytes;
  gap.files = {{file, 0, size, "", {{0, size / 2, "0"}}},
               {file, 1, size, "", {{size / 2 + 1, size - size / 2 - 1, "1"}}}};
  auto [headless, headless_path] = save("headless");
  {  // the header's length field overwritten: the same size, no valid header
    std::fstream f(headless_path, std::ios::in | std::ios::out | std::ios::binary);
    f.write("\xff\xff\xff\xff", 4);
  }
  for (const CheckpointManifest& m : {missing, truncated, lying, gap, headless}) {
    absl::StatusOr<v1::CheckpointInfo> info = catalog.Commit(m, 0);
    ASSERT_FALSE(info.ok()) << m.name;
    EXPECT_EQ(info.status().code(), absl::StatusCode::kDataLoss) << info.status();
    EXPECT_THAT(std::string(info.status().message()), ::testing::HasSubstr(file)) << m.name;
    EXPECT_FALSE(fs::exists(root / "j" / m.name)) << m.name;
  }
  EXPECT_THAT(Names(catalog), ::testing::ElementsAre("good"));
}

}  // namespace
}  // namespace flatshard
