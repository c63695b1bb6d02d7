// FULL checkpoint files that every rank writes part of (format version 3,
// storage/safetensors_region_writer.h): the writers together produce the very
// file one writer would, each vouches for its own regions, and the reader
// verifies and shares them writer by writer, so damage in one rank's bytes
// fails exactly that rank's share and names it.
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

#include "storage/checkpoint_reader.h"
#include "storage/fault_injecting_file_system.h"
#include "storage/safetensors_file_writer.h"
#include "storage/safetensors_region_writer.h"

namespace flatshard {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// Two tensors, one of them bfloat16 (converted as it is written), laid out
// like a unit's flat value: element i of the concatenation is i + 1.
const std::vector<SafetensorsSlot> kSlots = {{"fc.weight", DType::kFloat32, {4, 2}},
                                             {"fc.bias", DType::kBFloat16, {3}}};
constexpr uint64_t kNumel = 11;
const std::map<std::string, std::string> kMetadata = {{"format", "flatshard"}};

std::vector<float> Values(uint64_t begin, uint64_t end) {
  std::vector<float> v;
  for (uint64_t i = begin; i < end; ++i) v.push_back(static_cast<float>(i + 1));
  return v;
}

std::string Contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string FreshDir(const std::string& name) {
  std::string dir = absl::StrCat(::testing::TempDir(), "/shared-file-", name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// Rank r of `world` writes elements [11 r / W, 11 (r + 1) / W) of the flat
// concatenation (each tensor's part of it), rank 0 the header too, every
// writer opening the file for itself as the ranks' processes do.
std::vector<CheckpointFile> WriteShared(const std::string& path, int world) {
  std::vector<CheckpointFile> entries;
  for (int r = 0; r < world; ++r) {
    auto writer = SafetensorsRegionWriter::Open(path, kSlots, kMetadata, /*writes_header=*/r == 0);
    EXPECT_TRUE(writer.ok()) << writer.status();
    const uint64_t begin = kNumel * static_cast<uint64_t>(r) / static_cast<uint64_t>(world);
    const uint64_t end = kNumel * static_cast<uint64_t>(r + 1) / static_cast<uint64_t>(world);
    uint64_t tensor_begin = 0;
    for (const SafetensorsSlot& slot : kSlots) {
      const uint64_t tensor_end = tensor_begin + (slot.name == "fc.weight" ? 8 : 3);
      const uint64_t from = std::max(begin, tensor_begin), to = std::min(end, tensor_end);
      if (from < to) {
        EXPECT_TRUE((*writer)->Write(slot.name, from - tensor_begin, Values(from, to)).ok());
      }
      tensor_begin = tensor_end;
    }
    absl::StatusOr<SafetensorsRegionWriter::Written> written = (*writer)->Finish();
    EXPECT_TRUE(written.ok()) << written.status();
    entries.push_back(
        {fs::path(path).filename().string(), r, written->file_bytes, "", written->regions});
  }
  return entries;
}

// A FULL checkpoint whose model file `world` ranks wrote together, the
// optimizer file (no tensors) by rank 0 alone.
std::string WriteFullCheckpoint(const std::string& name, int world) {
  std::string dir = FreshDir(name);
  CheckpointManifest m;
  m.name = name;
  m.job = "test";
  m.job_spec.set_name("test");
  m.job_spec.set_world_size(world);
  m.job_spec_digest = JobSpecDigest(m.job_spec);
  m.state_dict_type = v1::FULL_STATE_DICT;
  m.world_size = world;
  m.strategy = "FULL_SHARD";
  m.params["fc.weight"] = {DType::kFloat32, {4, 2}};
  m.params["fc.bias"] = {DType::kBFloat16, {3}};
  m.optimizer = "sgd";
  m.files = WriteShared(absl::StrCat(dir, "/", kFullModelFile), world);
  auto optim = SafetensorsFileWriter::Create(absl::StrCat(dir, "/", kFullOptimFile), {});
  EXPECT_TRUE(optim.ok()) << optim.status();
  absl::StatusOr<FileDigest> digest = (*optim)->Finish();
  EXPECT_TRUE(digest.ok()) << digest.status();
  m.files.push_back({std::string(kFullOptimFile), 0, digest->bytes, digest->xxh3, {}});
  EXPECT_TRUE(WriteFileDurably(absl::StrCat(dir, "/", kManifestFileName), ManifestToJson(m)).ok());
  return dir;
}

// Flips a byte of the model file inside the regions rank `rank` wrote.
void DamageRegionOf(const std::string& dir, int rank) {
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir);
  ASSERT_TRUE(reader.ok()) << reader.status();
  for (const CheckpointFile& f : (*reader)->manifest().files) {
    if (f.name != kFullModelFile || f.rank != rank) continue;
    const FileRegion& last = f.regions.back();
    std::fstream file(absl::StrCat(dir, "/", f.name),
                      std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(static_cast<std::streamoff>(last.offset + last.bytes - 1));
    char c = 0;
    file.read(&c, 1);
    file.seekp(static_cast<std::streamoff>(last.offset + last.bytes - 1));
    c = static_cast<char>(c ^ 0x40);
    file.write(&c, 1);
    return;
  }
  FAIL() << "rank " << rank << " wrote nothing of the model file";
}

TEST(SharedFileCheckpointTest, WritersTogetherWriteTheFileOneWriterWould) {
  const std::string dir = FreshDir("together");
  auto one = SafetensorsFileWriter::Create(dir + "/one.safetensors", kSlots, kMetadata);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE((*one)->Append("fc.weight", Values(0, 8)).ok());
  ASSERT_TRUE((*one)->Append("fc.bias", Values(8, 11)).ok());
  absl::StatusOr<FileDigest> whole = (*one)->Finish();
  ASSERT_TRUE(whole.ok()) << whole.status();
  for (int world : {1, 2, 3, 4}) {
    SCOPED_TRACE(world);
    const std::string path = absl::StrCat(dir, "/shared-", world, ".safetensors");
    const std::vector<CheckpointFile> entries = WriteShared(path, world);
    EXPECT_EQ(Contents(path), Contents(dir + "/one.safetensors"));
    uint64_t covered = 0;
    for (const CheckpointFile& e : entries) {
      EXPECT_EQ(e.bytes, whole->bytes);
      // Each region's hash is of exactly its bytes.
      for (const FileRegion& r : e.regions) {
        absl::StatusOr<std::vector<FileDigest>> digest =
            DigestEachRange(path, {{r.offset, r.bytes}});
        ASSERT_TRUE(digest.ok()) << digest.status();
        EXPECT_EQ(digest->at(0).xxh3, r.xxh3);
        covered += r.bytes;
      }
    }
    EXPECT_EQ(covered, whole->bytes);  // the regions tile the file
    // One writer alone wrote it all: one region, the whole file's hash.
    if (world == 1) {
      ASSERT_EQ(entries[0].regions.size(), 1u);
      EXPECT_EQ(entries[0].regions[0], (FileRegion{0, whole->bytes, whole->xxh3}));
    }
  }
}

TEST(SharedFileCheckpointTest, ReadsBackAndVerifiesWriterByWriter) {
  const std::string dir = WriteFullCheckpoint("verify", 3);
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->manifest().format_version, 3);
  ASSERT_TRUE((*reader)->VerifyAll().ok());
  absl::StatusOr<std::vector<float>> weight = (*reader)->ReadFull("model", "fc.weight", {4, 2});
  ASSERT_TRUE(weight.ok()) << weight.status();
  EXPECT_EQ(*weight, Values(0, 8));
  absl::StatusOr<std::vector<float>> bias = (*reader)->ReadFull("model", "fc.bias", {3});
  ASSERT_TRUE(bias.ok()) << bias.status();
  EXPECT_EQ(*bias, Values(8, 11));  // small integers are exact in bfloat16
}

TEST(SharedFileCheckpointTest, DamageInARegionFailsExactlyOneShareAndNamesItsWriter) {
  const std::string dir = WriteFullCheckpoint("damage", 2);
  DamageRegionOf(dir, 1);
  absl::StatusOr<std::unique_ptr<CheckpointReader>> all = CheckpointReader::Open(dir);
  ASSERT_TRUE(all.ok());
  const absl::Status verified = (*all)->VerifyAll();
  EXPECT_EQ(verified.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(verified.message()), HasSubstr("which rank 1 wrote"));
  // Exactly one reader hashes the damaged region, whatever the reader count.
  for (int count : {1, 2, 3, 5}) {
    int failed = 0;
    for (int index = 0; index < count; ++index) {
      absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir);
      ASSERT_TRUE(reader.ok());
      const absl::Status share = (*reader)->VerifyShare(index, count);
      if (share.ok()) continue;
      ++failed;
      EXPECT_EQ(share.code(), absl::StatusCode::kDataLoss) << share;
      EXPECT_THAT(std::string(share.message()), HasSubstr("which rank 1 wrote"));
    }
    EXPECT_EQ(failed, 1) << count << " readers";
  }
}

// The shared files' regions are dealt to readers by bytes in file order, so
// each reader hashes one contiguous part, and every region has one reader.
TEST(SharedFileCheckpointTest, ReadersHashContiguousPartsOfTheSharedFiles) {
  const std::string dir = WriteFullCheckpoint("dealt", 4);
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const CheckpointManifest& m = (*reader)->manifest();
  const std::vector<CheckpointReader::HashUnit> units = CheckpointReader::HashUnits(m);
  for (int count : {1, 2, 3, 4}) {
    const std::vector<int> verifiers = CheckpointReader::Verifiers(m, count);
    ASSERT_EQ(verifiers.size(), units.size());
    for (size_t u = 1; u < units.size(); ++u) {
      const bool same_file = m.files[units[u].entry].name == m.files[units[u - 1].entry].name;
      if (!same_file) continue;
      EXPECT_GE(units[u].offset, units[u - 1].offset + units[u - 1].bytes);
      EXPECT_GE(verifiers[u], verifiers[u - 1]) << "count " << count;
    }
    EXPECT_EQ(verifiers.front(), 0);
  }
}

TEST(SharedFileCheckpointTest, DeferredReadsAcrossWritersLandWithTheirShare) {
  const std::string dir = WriteFullCheckpoint("deferred", 2);
  for (int index : {0, 1}) {
    SCOPED_TRACE(index);
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir);
    ASSERT_TRUE(reader.ok());
    ASSERT_TRUE((*reader)->BeginShare(index, 2).ok());
    // fc.weight's 8 elements: rank 0 wrote 0-4, rank 1 5-7; one read spans both.
    std::vector<float> weight(8, -1.0f);
    ASSERT_TRUE((*reader)->ReadRangeDeferred("model", "fc.weight", {4, 2}, 0, weight).ok());
    EXPECT_EQ(weight, std::vector<float>(8, -1.0f));  // nothing lands before FinishShare
    ASSERT_TRUE((*reader)->FinishShare(/*deliver=*/true).ok());
    EXPECT_EQ(weight, Values(0, 8));
  }
}

TEST(SharedFileCheckpointTest, RefusesWritesOutOfOrderOrOutsideTheirTensor) {
  const std::string dir = FreshDir("refused");
  auto writer = SafetensorsRegionWriter::Open(dir + "/m.safetensors", kSlots, kMetadata, true);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Write("fc.weight", 4, Values(4, 6)).ok());
  EXPECT_THAT(std::string((*writer)->Write("fc.weight", 0, Values(0, 2)).message()),
              HasSubstr("comes behind"));
  EXPECT_THAT(std::string((*writer)->Write("fc.bias", 2, Values(0, 2)).message()),
              HasSubstr("outside its 3"));
  EXPECT_THAT(std::string((*writer)->Write("fc.gone", 0, Values(0, 1)).message()),
              HasSubstr("no tensor 'fc.gone'"));
}

TEST(SharedFileCheckpointTest, AFullDiskFailsTheWriterThatHitIt) {
  const std::string dir = FreshDir("full-disk");
  FaultInjectingFileSystem faulty(FileSystem::Default(),
                                  {{FileFault::Kind::kDiskFull, "m.safetensors", 20}});
  auto writer =
      SafetensorsRegionWriter::Open(dir + "/m.safetensors", kSlots, kMetadata, false, &faulty);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Write("fc.weight", 0, Values(0, 4)).ok());  // 16 bytes fit
  const absl::Status full = (*writer)->Write("fc.weight", 4, Values(4, 8));
  EXPECT_EQ(full.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(full.message()), HasSubstr("No space left"));
}

}  // namespace
}  // namespace flatshard
