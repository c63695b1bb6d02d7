// The checkpoint reader (storage/checkpoint_reader.h): shared verification (W
// readers that each verify their share have hashed every file exactly once
// between them, so any damaged file fails exactly one share, while damage a
// size or header check sees fails every share), and SHARDED tensors read from
// their pieces, row chunks (format version 1) or element ranges (version 2)
// that must tile them.
#include "storage/checkpoint_reader.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

#include "core/sharded_tensor_pieces.h"
#include "core/status_macros.h"
#include "storage/durable_file.h"
#include "storage/safetensors_file_writer.h"

namespace flatshard {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

// One file's piece of fc.weight (and of its exp_avg): elements
// [offset, offset + count) of the 8.
struct FilePiece {
  uint64_t offset = 0;
  uint64_t count = 0;
};

// A SHARDED checkpoint of one [4, 2] parameter and its exp_avg whose rank r
// files hold `pieces[r]`, committed with a manifest. Element i of fc.weight
// holds i + 1, of its exp_avg 100 + i. Format version 2 writes 1-D pieces with
// their offsets in the metadata; version 1 writes the pieces (which must then
// be whole rows) as [rows, 2] chunks without offsets.
std::string WritePieces(const std::string& name, const std::vector<std::vector<FilePiece>>& pieces,
                        int version = kCheckpointFormatVersion) {
  const auto world = static_cast<int>(pieces.size());
  std::string dir = absl::StrCat(::testing::TempDir(), "/checkpoint-reader-", name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  CheckpointManifest m;
  m.format_version = version;
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
  for (int r = 0; r < world; ++r) {
    for (const std::string kind : {"model", "optim"}) {
      const std::string file = RankFileName(kind, r, world);
      const std::string tensor = kind == "model" ? "fc.weight" : "fc.weight.exp_avg";
      const float base = kind == "model" ? 1.0f : 100.0f;
      std::vector<SafetensorsSlot> slots;
      std::map<std::string, int64_t> offsets;
      const auto& mine = pieces[static_cast<size_t>(r)];
      for (size_t k = 0; k < mine.size(); ++k) {
        // A file holds one piece of a tensor; further pieces get other names
        // (what a writer that repeats a tensor would leave).
        const std::string piece_name = k == 0 ? tensor : absl::StrCat(tensor, ".", k);
        const auto count = static_cast<int64_t>(mine[k].count);
        slots.push_back({piece_name, DType::kFloat32,
                         version == kRowChunkFormatVersion ? std::vector<int64_t>{count / 2, 2}
                                                           : std::vector<int64_t>{count}});
        offsets[piece_name] = static_cast<int64_t>(mine[k].offset);
      }
      std::map<std::string, std::string> metadata;
      if (version != kRowChunkFormatVersion) {
        metadata[std::string(kElementOffsetsKey)] = ElementOffsetsToJson(offsets);
      }
      auto writer = SafetensorsFileWriter::Create(absl::StrCat(dir, "/", file), slots, metadata);
      EXPECT_TRUE(writer.ok()) << writer.status();
      for (size_t k = 0; k < mine.size(); ++k) {
        std::vector<float> values(mine[k].count);
        for (size_t i = 0; i < values.size(); ++i) {
          values[i] = base + static_cast<float>(mine[k].offset + i);
        }
        EXPECT_TRUE((*writer)->Append(slots[k].name, values).ok());
      }
      absl::StatusOr<FileDigest> digest = (*writer)->Finish();
      EXPECT_TRUE(digest.ok()) << digest.status();
      m.files.push_back({file, r, digest->bytes, digest->xxh3, {}});
    }
  }
  EXPECT_TRUE(WriteFileDurably(absl::StrCat(dir, "/", kManifestFileName), ManifestToJson(m)).ok());
  return dir;
}

// Saved by `world` ranks that each hold 4 / world rows.
std::string WriteCheckpoint(const std::string& name, int world,
                            int version = kCheckpointFormatVersion) {
  const auto per_rank = static_cast<uint64_t>(8 / world);
  std::vector<std::vector<FilePiece>> pieces(static_cast<size_t>(world));
  for (size_t r = 0; r < pieces.size(); ++r) pieces[r] = {{r * per_rank, per_rank}};
  return WritePieces(name, pieces, version);
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
      const int v = CheckpointReader::Verifiers(m, count)[i];
      ASSERT_GE(v, 0);
      ASSERT_LT(v, count);
      ++per_reader[static_cast<size_t>(v)];
    }
    // Spread: 8 files over `count` readers, no reader more than its share + 1.
    for (int n : per_reader) EXPECT_LE(n, (8 + count - 1) / count) << "count " << count;
  }
  // At the saving world size each rank hashes the files it wrote.
  for (size_t i = 0; i < m.files.size(); ++i) {
    EXPECT_EQ(CheckpointReader::Verifiers(m, 4)[i], m.files[i].rank) << m.files[i].name;
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
        EXPECT_EQ(r, CheckpointReader::Verifiers(m, count)[i]);
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

// A range across the ranks' pieces reads straight into the caller's span,
// from row chunks (version 1) and from element pieces (version 2) alike.
TEST(CheckpointReaderTest, ReadsARangeAcrossPiecesIntoTheCallersSpan) {
  for (const int version : {kRowChunkFormatVersion, kCheckpointFormatVersion}) {
    SCOPED_TRACE(absl::StrCat("format version ", version));
    const std::string dir = WriteCheckpoint(absl::StrCat("range", version), 4, version);
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir);
    ASSERT_TRUE(reader.ok()) << reader.status();
    std::vector<float> out(7, -1.0f);
    ASSERT_TRUE(
        (*reader)->ReadRangeInto("model", "fc.weight", {4, 2}, 1, std::span(out).first(5)).ok());
    EXPECT_EQ(out, (std::vector<float>{2, 3, 4, 5, 6, -1, -1}));
    absl::StatusOr<std::vector<float>> whole =
        (*reader)->ReadRange("optim", "fc.weight.exp_avg", {4, 2}, 0, 8);
    ASSERT_TRUE(whole.ok()) << whole.status();
    EXPECT_EQ(*whole, (std::vector<float>{100, 101, 102, 103, 104, 105, 106, 107}));
    EXPECT_EQ(
        (*reader)->ReadRangeInto("model", "fc.weight", {4, 2}, 4, std::span(out).first(5)).code(),
        absl::StatusCode::kOutOfRange);
    EXPECT_EQ((*reader)->ReadRangeInto("model", "nope", {4, 2}, 0, std::span(out).first(2)).code(),
              absl::StatusCode::kNotFound);
  }
}

// Version 2 pieces are any contiguous tiling (a flat shard's boundaries fall
// inside rows; a rank may hold nothing of a tensor), in any file order.
TEST(CheckpointReaderTest, ElementPiecesMayCutRowsAndSkipRanks) {
  const std::string dir = WritePieces("uneven", {{{5, 3}}, {}, {{0, 5}}});
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir);
  ASSERT_TRUE(reader.ok()) << reader.status();
  absl::StatusOr<std::vector<float>> whole = (*reader)->ReadFull("model", "fc.weight", {4, 2});
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(*whole, (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}));
  absl::StatusOr<std::vector<float>> middle =
      (*reader)->ReadRange("optim", "fc.weight.exp_avg", {4, 2}, 4, 6);
  ASSERT_TRUE(middle.ok()) << middle.status();
  EXPECT_EQ(*middle, (std::vector<float>{104, 105}));
}

// Pieces that do not tile the tensor are damage, named, whatever part is
// read: a gap, an overlap, a piece past the end. A tensor no file has is
// NOT_FOUND (the loader's "no state").
TEST(CheckpointReaderTest, PiecesThatDoNotTileTheTensorAreDataLoss) {
  const struct {
    const char* name;
    std::vector<std::vector<FilePiece>> pieces;
    const char* says;
  } cases[] = {
      {"gap", {{{0, 3}}, {{4, 4}}}, "leave a gap at element 3"},
      {"overlap", {{{0, 5}}, {{4, 4}}}, "overlap at element 4"},
      {"past-end", {{{0, 4}}, {{4, 6}}}, "runs past its 8 elements"},
      {"short", {{{0, 4}}, {{4, 2}}}, "hold 6 of its 8 elements"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string dir = WritePieces(c.name, c.pieces);
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir);
    ASSERT_TRUE(reader.ok()) << reader.status();
    std::vector<float> out(1);
    const absl::Status s = (*reader)->ReadRangeInto("model", "fc.weight", {4, 2}, 0, out);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("'fc.weight'"));
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.says));
  }
  const std::string dir = WriteCheckpoint("absent", 2);
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->ReadFull("optim", "fc.weight.exp_avg_sq", {4, 2}).status().code(),
            absl::StatusCode::kNotFound);
}

// A share's reads wait for FinishShare and land then, the file read once and
// hashed as it lands; deferred reads from files outside the share land after
// it. Saved by 2 ranks, read by reader 0 of 2: rank 0's files are its share.
TEST(CheckpointReaderTest, DeferredReadsFromTheShareLandAtFinishShare) {
  const std::string dir = WriteCheckpoint("deferred", 2);
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir);
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_TRUE((*reader)->BeginShare(0, 2).ok());
  std::vector<float> weight(8, -1.0f), exp_avg(6, -1.0f);
  ASSERT_TRUE((*reader)->ReadRangeDeferred("model", "fc.weight", {4, 2}, 0, weight).ok());
  ASSERT_TRUE((*reader)->ReadRangeDeferred("optim", "fc.weight.exp_avg", {4, 2}, 1, exp_avg).ok());
  // Both halves wait, rank 0's (the share) and rank 1's.
  EXPECT_EQ(weight, std::vector<float>(8, -1.0f));
  EXPECT_EQ(exp_avg, std::vector<float>(6, -1.0f));
  // A read that is not deferred reads the share's file at once.
  absl::StatusOr<std::vector<float>> now = (*reader)->ReadRange("model", "fc.weight", {4, 2}, 2, 3);
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(*now, (std::vector<float>{3}));
  ASSERT_TRUE((*reader)->FinishShare(/*deliver=*/true).ok());
  EXPECT_EQ(weight, (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(exp_avg, (std::vector<float>{101, 102, 103, 104, 105, 106}));
  // Nothing is pending any more: a deferred read now reads at once.
  std::vector<float> again(2, -1.0f);
  ASSERT_TRUE((*reader)->ReadRangeDeferred("model", "fc.weight", {4, 2}, 0, again).ok());
  EXPECT_EQ(again, (std::vector<float>{1, 2}));
}

// Reads from another reader's file wait for FinishShare too, and a staging
// that failed (no delivery) gets none of them, nor after damage in the share.
TEST(CheckpointReaderTest, ReadsOutsideTheShareLandOnlyWithADeliveredShare) {
  const std::string dir = WriteCheckpoint("late", 2);
  const std::string own = absl::StrCat(dir, "/", RankFileName("model", 0, 2));
  for (const bool damaged : {false, true}) {
    for (const bool deliver : {false, true}) {
      SCOPED_TRACE(absl::StrCat(damaged ? "damaged" : "intact", deliver ? ", delivered" : ""));
      if (damaged) FlipLastByte(own);
      absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir);
      ASSERT_TRUE(reader.ok()) << reader.status();
      ASSERT_TRUE((*reader)->BeginShare(0, 2).ok());
      std::vector<float> theirs(4, -1.0f);  // rank 1's half: outside reader 0's share
      ASSERT_TRUE((*reader)->ReadRangeDeferred("model", "fc.weight", {4, 2}, 4, theirs).ok());
      EXPECT_EQ(theirs, std::vector<float>(4, -1.0f));
      const absl::Status finished = (*reader)->FinishShare(deliver);
      EXPECT_EQ(finished.ok(), !damaged) << finished;
      EXPECT_EQ(theirs, deliver && !damaged ? (std::vector<float>{5, 6, 7, 8})
                                            : std::vector<float>(4, -1.0f));
      if (damaged) FlipLastByte(own);  // restored
    }
  }
}

// Two deferred reads of the same bytes both land; the file still verifies.
TEST(CheckpointReaderTest, OverlappingDeferredReadsBothLand) {
  const std::string dir = WriteCheckpoint("overlap-reads", 1);
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir);
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_TRUE((*reader)->BeginShare(0, 1).ok());
  std::vector<float> a(4, -1.0f), b(4, -1.0f);
  ASSERT_TRUE((*reader)->ReadRangeDeferred("model", "fc.weight", {4, 2}, 2, a).ok());
  ASSERT_TRUE((*reader)->ReadRangeDeferred("model", "fc.weight", {4, 2}, 0, b).ok());
  ASSERT_TRUE((*reader)->FinishShare(/*deliver=*/true).ok());
  EXPECT_EQ(a, (std::vector<float>{3, 4, 5, 6}));
  EXPECT_EQ(b, (std::vector<float>{1, 2, 3, 4}));
}

// Damage in a share's data fails FinishShare naming the file, delivered or
// not; without delivery (a staging that failed) nothing lands in the spans.
TEST(CheckpointReaderTest, FinishShareVerifiesWhetherOrNotItDelivers) {
  const std::string dir = WriteCheckpoint("finish", 2);
  const std::string own = RankFileName("model", 0, 2);
  for (const bool damaged : {false, true}) {
    for (const bool deliver : {false, true}) {
      SCOPED_TRACE(absl::StrCat(damaged ? "damaged" : "intact", deliver ? ", delivered" : ""));
      if (damaged) FlipLastByte(absl::StrCat(dir, "/", own));
      absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir);
      ASSERT_TRUE(reader.ok()) << reader.status();
      ASSERT_TRUE((*reader)->BeginShare(0, 2).ok());
      std::vector<float> weight(4, -1.0f);
      ASSERT_TRUE((*reader)->ReadRangeDeferred("model", "fc.weight", {4, 2}, 0, weight).ok());
      const absl::Status finished = (*reader)->FinishShare(deliver);
      if (damaged) {
        EXPECT_EQ(finished.code(), absl::StatusCode::kDataLoss) << finished;
        EXPECT_THAT(std::string(finished.message()), HasSubstr(own));
        EXPECT_THAT(std::string(finished.message()), HasSubstr("fails its checksum"));
        FlipLastByte(absl::StrCat(dir, "/", own));  // restored
      } else {
        EXPECT_TRUE(finished.ok()) << finished;
      }
      if (!deliver) {
        EXPECT_EQ(weight, (std::vector<float>(4, -1.0f)));
      } else if (!damaged) {
        EXPECT_EQ(weight, (std::vector<float>{1, 2, 3, 4}));
      }
    }
  }
}

// A stop that answers true ends the share ABORTED at the next MiB it would
// read: nothing more is read, verified or delivered. One that stays false
// changes nothing.
TEST(CheckpointReaderTest, FinishShareStopsWhenAskedTo) {
  const std::string dir = WriteCheckpoint("stopped", 1);
  for (const bool stopped : {false, true}) {
    SCOPED_TRACE(stopped ? "stopped" : "not stopped");
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir);
    ASSERT_TRUE(reader.ok()) << reader.status();
    ASSERT_TRUE((*reader)->BeginShare(0, 1).ok());
    std::vector<float> weight(8, -1.0f), exp_avg(8, -1.0f);
    ASSERT_TRUE((*reader)->ReadRangeDeferred("model", "fc.weight", {4, 2}, 0, weight).ok());
    ASSERT_TRUE(
        (*reader)->ReadRangeDeferred("optim", "fc.weight.exp_avg", {4, 2}, 0, exp_avg).ok());
    int asked = 0;
    const absl::Status finished = (*reader)->FinishShare(/*deliver=*/true, [&] {
      ++asked;
      return stopped;
    });
    if (stopped) {
      EXPECT_EQ(finished.code(), absl::StatusCode::kAborted) << finished;
      EXPECT_THAT(std::string(finished.message()), HasSubstr("was aborted after 0 of"));
      EXPECT_EQ(asked, 1) << "read on after the stop";
      EXPECT_EQ(weight, std::vector<float>(8, -1.0f));
      EXPECT_EQ(exp_avg, std::vector<float>(8, -1.0f));
    } else {
      EXPECT_TRUE(finished.ok()) << finished;
      EXPECT_GE(asked, 2);  // once per file at least: the model's and the optimizer's
      EXPECT_EQ(weight, (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}));
      EXPECT_NE(exp_avg, std::vector<float>(8, -1.0f));
    }
  }
}

// The reads outside the share, done after it, ask too: a stop there (the
// last ask, counted in a run that was not stopped) leaves them unread.
TEST(CheckpointReaderTest, FinishShareStopsInTheReadsOutsideTheShare) {
  const std::string dir = WriteCheckpoint("stopped-late", 2);
  auto finish = [&](int stop_at, std::vector<float>& theirs, int& asked) {
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir);
    EXPECT_TRUE(reader.ok()) << reader.status();
    if (!reader.ok()) return reader.status();
    RETURN_IF_ERROR((*reader)->BeginShare(0, 2));
    RETURN_IF_ERROR((*reader)->ReadRangeDeferred("model", "fc.weight", {4, 2}, 4, theirs));
    return (*reader)->FinishShare(/*deliver=*/true, [&] { return ++asked == stop_at; });
  };
  std::vector<float> theirs(4, -1.0f);
  int asks = 0;
  ASSERT_TRUE(finish(0, theirs, asks).ok());
  ASSERT_EQ(theirs, (std::vector<float>{5, 6, 7, 8}));
  ASSERT_GE(asks, 2);  // the share, then the read outside it
  std::fill(theirs.begin(), theirs.end(), -1.0f);
  int asked = 0;
  const absl::Status stopped = finish(asks, theirs, asked);
  EXPECT_EQ(stopped.code(), absl::StatusCode::kAborted) << stopped;
  EXPECT_THAT(std::string(stopped.message()), HasSubstr("was aborted at byte"));
  EXPECT_EQ(theirs, std::vector<float>(4, -1.0f));
}

// A share's file whose header is damaged is reported as damaged (its hash),
// not as what its header says; the reader that does not hash it sees the
// header's fault.
TEST(CheckpointReaderTest, ADamagedHeaderInTheShareIsReportedAsDamage) {
  const std::string dir = WriteCheckpoint("header", 2);
  const std::string own = RankFileName("model", 0, 2);
  {
    std::fstream f(absl::StrCat(dir, "/", own), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);  // the header's opening brace
    f.write("[", 1);
  }
  absl::StatusOr<std::unique_ptr<CheckpointReader>> owner = CheckpointReader::Open(dir);
  ASSERT_TRUE(owner.ok()) << owner.status();
  const absl::Status hashed = (*owner)->BeginShare(0, 2);
  EXPECT_EQ(hashed.code(), absl::StatusCode::kDataLoss) << hashed;
  EXPECT_THAT(std::string(hashed.message()), HasSubstr("fails its checksum"));
  absl::StatusOr<std::unique_ptr<CheckpointReader>> other = CheckpointReader::Open(dir);
  ASSERT_TRUE(other.ok()) << other.status();
  const absl::Status parsed = (*other)->BeginShare(1, 2);
  EXPECT_FALSE(parsed.ok());
  EXPECT_THAT(std::string(parsed.message()), HasSubstr(own));
  EXPECT_THAT(std::string(parsed.message()), Not(HasSubstr("checksum")));
  // With its own share damaged too, that reader reports its own damage: it
  // is the one reader that hashes it.
  const std::string theirs = RankFileName("optim", 1, 2);
  FlipLastByte(absl::StrCat(dir, "/", theirs));
  absl::StatusOr<std::unique_ptr<CheckpointReader>> both = CheckpointReader::Open(dir);
  ASSERT_TRUE(both.ok()) << both.status();
  const absl::Status own_damage = (*both)->BeginShare(1, 2);
  EXPECT_EQ(own_damage.code(), absl::StatusCode::kDataLoss) << own_damage;
  EXPECT_THAT(std::string(own_damage.message()), HasSubstr(theirs));
  EXPECT_THAT(std::string(own_damage.message()), HasSubstr("fails its checksum"));
}

// Hashing a damaged share in BeginShare asks the stop as FinishShare does:
// a load whose job was aborted lets go within a MiB, not after the file.
TEST(CheckpointReaderTest, BeginShareStopsHashingADamagedShareWhenAskedTo) {
  const std::string dir = WriteCheckpoint("header-stopped", 2);
  const std::string own = RankFileName("model", 0, 2);
  {
    std::fstream f(absl::StrCat(dir, "/", own), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    f.write("[", 1);
  }
  const std::string theirs = RankFileName("optim", 1, 2);
  FlipLastByte(absl::StrCat(dir, "/", theirs));
  // Reader 0's own file has the bad header (hashed at once); reader 1 finds
  // it among the others' and hashes its own damaged share first.
  for (const int index : {0, 1}) {
    SCOPED_TRACE(absl::StrCat("reader ", index));
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir);
    ASSERT_TRUE(reader.ok()) << reader.status();
    int asked = 0;
    const absl::Status stopped = (*reader)->BeginShare(index, 2, [&] {
      ++asked;
      return true;
    });
    EXPECT_EQ(stopped.code(), absl::StatusCode::kAborted) << stopped;
    // Reader 0 while it hashes its file whole, reader 1 in its share's pass.
    EXPECT_THAT(std::string(stopped.message()),
                HasSubstr(index == 0 ? absl::StrCat("hashing ", dir, "/", own, " was aborted")
                                     : std::string("was aborted after 0 of")));
    EXPECT_EQ(asked, 1) << "hashed on after the stop";
  }
}

TEST(CheckpointReaderTest, RefusesAShareThatIsNotOne) {
  const std::string dir = WriteCheckpoint("bad-share", 2);
  EXPECT_EQ(Share(dir, 2, 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Share(dir, -1, 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Share(dir, 0, 0).code(), absl::StatusCode::kInvalidArgument);
  // One share per reader, during or after the first: the first left the
  // other share's files open unhashed.
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir);
  ASSERT_TRUE(reader.ok());
  ASSERT_TRUE((*reader)->BeginShare(0, 2).ok());
  EXPECT_EQ((*reader)->BeginShare(1, 2).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*reader)->FinishShare(/*deliver=*/true).ok());
  EXPECT_EQ((*reader)->BeginShare(1, 2).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace flatshard
