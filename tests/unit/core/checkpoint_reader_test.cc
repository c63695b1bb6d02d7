// The checkpoint reader's shared verification (core/checkpoint_reader.h): W
// readers that each verify their share have hashed every file exactly once
// between them, so any damaged file fails exactly one share, while damage a
// size or header check sees fails every share.
#include "core/checkpoint_reader.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

#include "core/durable_file.h"
#include "core/safetensors_file_writer.h"

namespace flatshard {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A SHARDED checkpoint of one [4, 2] parameter and its exp_avg, saved by
// `world` ranks (each writes its rows and state), committed with a manifest.
std::string WriteCheckpoint(const std::string& name, int world) {
  std::string dir = absl::StrCat(::testing::TempDir(), "/checkpoint-reader-", name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  CheckpointManifest m;
  m.name = name;
  m.job = "test";
  m.job_spec.set_name("test");
  m.job_spec.set_world_size(world);
  m.job_spec_digest = JobSpecDigest(m.job_spec);
  m.state_dict_type = v1::SHARDED_STATE_DICT;
  m.world_size = world;
  m.strategy = "FULL_SHARD";
  m.params["fc.weight"] = {DType::kFloat32, {4, 2}};
  m.optimizer = "adam";
  m.optimizer_states = {"exp_avg"};
  const int64_t rows = 4 / world;
  for (int r = 0; r < world; ++r) {
    for (const std::string kind : {"model", "optim"}) {
      const std::string file = RankFileName(kind, r, world);
      const std::string tensor = kind == "model" ? "fc.weight" : "fc.weight.exp_avg";
      auto writer = SafetensorsFileWriter::Create(absl::StrCat(dir, "/", file),
                                                  {{tensor, DType::kFloat32, {rows, 2}}});
      EXPECT_TRUE(writer.ok()) << writer.status();
      std::vector<float> values(static_cast<size_t>(rows * 2), static_cast<float>(r + 1));
      EXPECT_TRUE((*writer)->Append(tensor, values).ok());
      absl::StatusOr<FileDigest> digest = (*writer)->Finish();
      EXPECT_TRUE(digest.ok()) << digest.status();
      m.files.push_back({file, r, digest->bytes, digest->xxh3});
    }
  }
  EXPECT_TRUE(WriteFileDurably(absl::StrCat(dir, "/", kManifestFileName), ManifestToJson(m)).ok());
  return dir;
}

void FlipLastByte(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-1, std::ios::end);
  char c = 0;
  f.read(&c, 1);
  f.seekp(-1, std::ios::end);
  c = static_cast<char>(c ^ 0x40);
  f.write(&c, 1);
}

absl::Status Share(const std::string& dir, int index, int count) {
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir);
  if (!reader.ok()) return reader.status();
  return (*reader)->VerifyShare(index, count);
}

TEST(CheckpointReaderTest, EveryFileHasExactlyOneVerifierWhateverTheReaderCount) {
  const std::string dir = WriteCheckpoint("owners", 4);
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const CheckpointManifest& m = (*reader)->manifest();
  for (int count : {1, 2, 3, 4, 8}) {
    std::vector<int> per_reader(static_cast<size_t>(count), 0);
    for (size_t i = 0; i < m.files.size(); ++i) {
      const int v = CheckpointReader::VerifierOf(m, i, count);
      ASSERT_GE(v, 0);
      ASSERT_LT(v, count);
      ++per_reader[static_cast<size_t>(v)];
    }
    // Spread: 8 files over `count` readers, no reader more than its share + 1.
    for (int n : per_reader) EXPECT_LE(n, (8 + count - 1) / count) << "count " << count;
  }
  // At the saving world size each rank hashes the files it wrote.
  for (size_t i = 0; i < m.files.size(); ++i) {
    EXPECT_EQ(CheckpointReader::VerifierOf(m, i, 4), m.files[i].rank) << m.files[i].name;
  }
}

TEST(CheckpointReaderTest, AFlippedByteFailsExactlyTheShareThatHashesItsFile) {
  for (int count : {1, 2, 3, 4}) {
    const std::string dir = WriteCheckpoint(absl::StrCat("flip", count), 4);
    for (int r = 0; r < count; ++r) EXPECT_TRUE(Share(dir, r, count).ok());
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir);
    ASSERT_TRUE(reader.ok());
    const CheckpointManifest m = (*reader)->manifest();
    for (size_t i = 0; i < m.files.size(); ++i) {
      const std::string path = absl::StrCat(dir, "/", m.files[i].name);
      FlipLastByte(path);  // data, not header: only a hash sees it
      int failed = 0;
      for (int r = 0; r < count; ++r) {
        const absl::Status s = Share(dir, r, count);
        if (s.ok()) continue;
        ++failed;
        EXPECT_EQ(r, CheckpointReader::VerifierOf(m, i, count));
        EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
        EXPECT_THAT(std::string(s.message()), HasSubstr(m.files[i].name));
        EXPECT_THAT(std::string(s.message()), HasSubstr("fails its checksum"));
      }
      EXPECT_EQ(failed, 1) << m.files[i].name << " with " << count << " readers";
      FlipLastByte(path);  // restored
    }
  }
}

TEST(CheckpointReaderTest, TruncatedOrMissingFilesFailEveryShare) {
  const std::string dir = WriteCheckpoint("truncate", 2);
  const std::string victim = absl::StrCat(dir, "/", RankFileName("optim", 1, 2));
  fs::resize_file(victim, fs::file_size(victim) - 4);
  for (int r = 0; r < 2; ++r) {
    const absl::Status s = Share(dir, r, 2);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("truncated or replaced"));
  }
  fs::remove(victim);
  for (int r = 0; r < 2; ++r) {
    const absl::Status s = Share(dir, r, 2);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("is missing"));
  }
}

// A range across the ranks' row chunks reads straight into the caller's
// span: rank r's rows hold r + 1 (one row each at world size 4, 2 elements).
TEST(CheckpointReaderTest, ReadsARangeAcrossChunksIntoTheCallersSpan) {
  const std::string dir = WriteCheckpoint("range", 4);
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<float> out(7, -1.0f);
  ASSERT_TRUE(
      (*reader)->ReadRangeInto("model", "fc.weight", {4, 2}, 1, std::span(out).first(5)).ok());
  EXPECT_EQ(out, (std::vector<float>{1, 2, 2, 3, 3, -1, -1}));
  absl::StatusOr<std::vector<float>> whole =
      (*reader)->ReadRange("optim", "fc.weight.exp_avg", {4, 2}, 0, 8);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(*whole, (std::vector<float>{1, 1, 2, 2, 3, 3, 4, 4}));
  EXPECT_EQ(
      (*reader)->ReadRangeInto("model", "fc.weight", {4, 2}, 4, std::span(out).first(5)).code(),
      absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*reader)->ReadRangeInto("model", "nope", {4, 2}, 0, std::span(out).first(2)).code(),
            absl::StatusCode::kNotFound);
}

TEST(CheckpointReaderTest, RefusesAShareThatIsNotOne) {
  const std::string dir = WriteCheckpoint("bad-share", 2);
  EXPECT_EQ(Share(dir, 2, 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Share(dir, -1, 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Share(dir, 0, 0).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace flatshard
