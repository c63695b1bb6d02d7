// The strict safetensors reader (storage/safetensors_reader.h): what the writers
// produce reads back exactly, and each kind of damage a checkpoint file can
// suffer is refused with a message that says what is wrong.
#include "storage/safetensors_reader.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/safetensors.h"
#include "storage/durable_file.h"
#include "storage/safetensors_file_writer.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;

std::string FloatBytes(std::initializer_list<float> values) {
  std::string out(values.size() * 4, '\0');
  std::memcpy(out.data(), std::data(values), out.size());
  return out;
}

// A file whose header is `json` (padded) followed by `data_bytes` bytes.
std::string Handmade(const std::string& json, size_t data_bytes) {
  std::string out(8, '\0');
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) {
    out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  }
  return out + json + std::string(data_bytes, '\x01');
}

absl::Status ParseStatus(const std::string& bytes) { return ParseSafetensors(bytes).status(); }

TEST(SafetensorsReaderTest, RoundTripsTheInMemoryWriter) {
  std::map<std::string, SafetensorsTensor> tensors;
  tensors["a.weight"] = {DType::kFloat32, {2, 2}, FloatBytes({1, 2, 3, 4})};
  tensors["b"] = {DType::kFloat32, {}, FloatBytes({7})};
  tensors["empty"] = {DType::kFloat32, {0, 3}, ""};
  absl::StatusOr<std::string> bytes = SerializeSafetensors(tensors, {{"format", "pt"}});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  std::map<std::string, std::string> metadata;
  auto parsed = ParseSafetensors(*bytes, &metadata);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(metadata.at("format"), "pt");
  ASSERT_EQ(parsed->size(), 3u);
  EXPECT_EQ(parsed->at("a.weight").data, tensors["a.weight"].data);
  EXPECT_EQ(parsed->at("a.weight").shape, (std::vector<int64_t>{2, 2}));
  EXPECT_TRUE(parsed->at("b").shape.empty());
}

TEST(SafetensorsReaderTest, StreamingWriterFileReadsBackAndConvertsDtypes) {
  const std::string dir = ::testing::TempDir() + "/st-stream";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/x.safetensors";
  auto writer = SafetensorsFileWriter::Create(
      path, {{"w", DType::kFloat32, {3}}, {"h", DType::kBFloat16, {2}}}, {{"k", "v"}});
  ASSERT_TRUE(writer.ok()) << writer.status();
  // Out of order and too many elements are refused before anything is
  // written wrong; a tensor may come in parts, and the next one starts only
  // once it is whole.
  EXPECT_FALSE((*writer)->Append("h", std::vector<float>{1, 2}).ok());
  EXPECT_FALSE((*writer)->Append("w", std::vector<float>{1, 2, 3, 4}).ok());
  ASSERT_TRUE((*writer)->Append("w", std::vector<float>{1.5f, -2.0f}).ok());
  EXPECT_EQ((*writer)->Finish().status().code(), absl::StatusCode::kFailedPrecondition);
  const absl::Status early = (*writer)->Append("h", std::vector<float>{1, 2});
  EXPECT_EQ(early.code(), absl::StatusCode::kInvalidArgument) << early;
  EXPECT_THAT(std::string(early.message()), HasSubstr("expected 'w' (2 of its elements written)"));
  const absl::Status over = (*writer)->Append("w", std::vector<float>{3.25f, 4});
  EXPECT_THAT(std::string(over.message()), HasSubstr("got 2 elements, 1 of its shape's 3 remain"));
  ASSERT_TRUE((*writer)->Append("w", std::vector<float>{3.25f}).ok());
  EXPECT_EQ((*writer)->Finish().status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*writer)->Append("h", std::vector<float>{1.0f}).ok());  // bf16, in parts too
  ASSERT_TRUE((*writer)->Append("h", std::vector<float>{0.5f}).ok());
  absl::StatusOr<FileDigest> digest = (*writer)->Finish();
  ASSERT_TRUE(digest.ok()) << digest.status();
  absl::StatusOr<FileDigest> reread = DigestFile(path);
  ASSERT_TRUE(reread.ok());
  EXPECT_EQ(reread->xxh3, digest->xxh3);  // the checksum computed while writing is the file's
  EXPECT_EQ(reread->bytes, digest->bytes);
  auto reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->header().metadata.at("k"), "v");
  auto w = (*reader)->ReadFloats("w", 1, 3);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(*w, (std::vector<float>{-2.0f, 3.25f}));
  auto h = (*reader)->ReadFloats("h", 0, 2);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(*h, (std::vector<float>{1.0f, 0.5f}));
  EXPECT_EQ((*reader)->ReadFloats("w", 2, 4).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string((*reader)->Find("nope").status().message()), HasSubstr(path));
  // A second writer on the same path is refused, not silently truncating it.
  EXPECT_EQ(SafetensorsFileWriter::Create(path, {}).status().code(),
            absl::StatusCode::kAlreadyExists);
}

TEST(SafetensorsReaderTest, AnUnfinishedWriterLeavesNoFile) {
  const std::string path = ::testing::TempDir() + "/st-unfinished.safetensors";
  std::filesystem::remove(path);
  {
    auto writer = SafetensorsFileWriter::Create(path, {{"w", DType::kFloat32, {3}}});
    ASSERT_TRUE(writer.ok());
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

struct BadCase {
  const char* what;
  std::string bytes;
  absl::StatusCode code;
  const char* message;
};

TEST(SafetensorsReaderTest, RefusesEveryKindOfDamage) {
  const std::string ok_entry = R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  std::string huge(8, '\0');
  huge[7] = 0x7f;  // a header length of ~9e18
  const std::vector<BadCase> cases = {
      {"shorter than the length prefix", "abc", absl::StatusCode::kDataLoss, "too short"},
      {"header length beyond the file", Handmade("{" + ok_entry + "}", 8).substr(0, 20),
       absl::StatusCode::kDataLoss, "runs past the end"},
      {"absurd header length", huge + "{}", absl::StatusCode::kInvalidArgument, "header length"},
      {"not JSON", Handmade("{nope", 0), absl::StatusCode::kInvalidArgument, "not a JSON object"},
      {"a JSON array", Handmade("[1,2]   ", 0), absl::StatusCode::kInvalidArgument,
       "does not start with '{'"},
      {"unknown dtype", Handmade(R"({"t":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}})", 8),
       absl::StatusCode::kInvalidArgument, "tensor 't'"},
      {"negative dimension",
       Handmade(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
       absl::StatusCode::kInvalidArgument, "non-negative integer"},
      {"shape and offsets disagree",
       Handmade(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
       absl::StatusCode::kInvalidArgument, "need 12"},
      {"offsets end before they begin",
       Handmade(R"({"t":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8),
       absl::StatusCode::kInvalidArgument, "end before they begin"},
      {"a gap between tensors",
       Handmade(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                12),
       absl::StatusCode::kInvalidArgument, "contiguous"},
      {"overlapping tensors",
       Handmade(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                8),
       absl::StatusCode::kInvalidArgument, "contiguous"},
      {"data truncated", Handmade("{" + ok_entry + "}", 5), absl::StatusCode::kDataLoss,
       "truncated"},
      {"trailing bytes", Handmade("{" + ok_entry + "}", 12), absl::StatusCode::kInvalidArgument,
       "after the last tensor"},
      {"metadata not strings", Handmade(R"({"__metadata__":{"a":1}})", 0),
       absl::StatusCode::kInvalidArgument, "__metadata__"},
      {"unknown entry field",
       Handmade(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8),
       absl::StatusCode::kInvalidArgument, "unknown field 'x'"},
      {"overflowing shape",
       Handmade(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
       absl::StatusCode::kInvalidArgument, "more elements"},
  };
  for (const BadCase& c : cases) {
    const absl::Status status = ParseStatus(c.bytes);
    EXPECT_EQ(status.code(), c.code) << c.what << ": " << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.message)) << c.what;
  }
}

TEST(SafetensorsReaderTest, OpenNamesTheFile) {
  const std::string path = ::testing::TempDir() + "/st-bad.safetensors";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << Handmade(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4);
  }
  auto reader = SafetensorsReader::Open(path);
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(reader.status().message()), HasSubstr(path));
  EXPECT_EQ(SafetensorsReader::Open(path + ".missing").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(SafetensorsReaderTest, WholeFileWriterReplacesAtomicallyAndNamesFailures) {
  const std::string dir = ::testing::TempDir() + "/st-whole";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/model.safetensors";
  std::map<std::string, SafetensorsTensor> tensors;
  tensors["w"] = {DType::kFloat32, {2}, FloatBytes({1.5f, -2.0f})};
  ASSERT_TRUE(WriteSafetensorsFile(path, tensors, {{"job", "a"}}).ok());
  // A second write replaces the first whole, and leaves no temporary file.
  tensors["w"].data = FloatBytes({3.0f, 4.0f});
  ASSERT_TRUE(WriteSafetensorsFile(path, tensors, {{"job", "b"}}).ok());
  absl::StatusOr<std::string> bytes = ReadFileToString(path);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  std::map<std::string, std::string> metadata;
  auto read = ParseSafetensors(*bytes, &metadata);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->at("w").data, FloatBytes({3.0f, 4.0f}));
  EXPECT_EQ(metadata.at("job"), "b");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir),
                          std::filesystem::directory_iterator()),
            1);

  // A directory that is not there: NOT_FOUND naming the file.
  const absl::Status missing = WriteSafetensorsFile(dir + "/no/such/dir/m.safetensors", tensors);
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.message()), HasSubstr("no/such/dir/m.safetensors"));
  // Data that disagrees with its shape is refused before any file is touched.
  tensors["w"].shape = {3};
  const absl::Status bad = WriteSafetensorsFile(path, tensors);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.message()), HasSubstr("'w'"));
  bytes = ReadFileToString(path);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(ParseSafetensors(*bytes)->at("w").data, FloatBytes({3.0f, 4.0f}));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace flatshard
