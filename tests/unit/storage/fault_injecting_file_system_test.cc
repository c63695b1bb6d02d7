// FaultInjectingFileSystem under SafetensorsFileWriter, on real files: a full
// disk keeps the bytes that fit and fails with ENOSPC, a failing fsync fails
// Finish, an unfinished file is removed, other files are untouched, a slow
// disk delays each write but writes every byte, and a bad fault spec is
// refused naming the part.
#include "storage/fault_injecting_file_system.h"

#include <filesystem>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"

#include "storage/safetensors_file_writer.h"

namespace flatshard {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string FreshDir(const std::string& tag) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("faulty-fs-" + tag);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

FaultInjectingFileSystem Faulty(const std::string& spec) {
  auto faults = ParseFileFaults(spec);
  EXPECT_TRUE(faults.ok()) << faults.status();
  return FaultInjectingFileSystem(FileSystem::Default(),
                                  faults.ok() ? *faults : std::vector<FileFault>{});
}

TEST(FaultInjectingFileSystemTest, AFullDiskFailsTheAppendAndTheFileIsRemoved) {
  const std::string dir = FreshDir("full");
  FaultInjectingFileSystem faulty = Faulty("disk-full:model:200");
  const std::vector<float> values(1000, 1.0f);
  {
    auto writer = SafetensorsFileWriter::Create(dir + "/model.safetensors",
                                                {{"w", DType::kFloat32, {1000}}}, {}, &faulty);
    ASSERT_TRUE(writer.ok()) << writer.status();  // the header fits in 200 bytes
    const absl::Status appended = (*writer)->Append("w", values);
    EXPECT_EQ(appended.code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(appended.message(), HasSubstr("No space left on device"));
    EXPECT_EQ(fs::file_size(dir + "/model.safetensors"), 200u);  // what fit
  }
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors"));  // never finished: removed
  // Another file is not affected.
  auto other = SafetensorsFileWriter::Create(dir + "/optim.safetensors",
                                             {{"w", DType::kFloat32, {1000}}}, {}, &faulty);
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE((*other)->Append("w", values).ok());
  auto digest = (*other)->Finish();
  ASSERT_TRUE(digest.ok()) << digest.status();
  EXPECT_EQ(digest->bytes, fs::file_size(dir + "/optim.safetensors"));
}

TEST(FaultInjectingFileSystemTest, AFailingFsyncFailsFinish) {
  const std::string dir = FreshDir("eio");
  FaultInjectingFileSystem faulty = Faulty("sync-error:model");
  auto writer = SafetensorsFileWriter::Create(dir + "/model.safetensors",
                                              {{"w", DType::kFloat32, {4}}}, {}, &faulty);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Append("w", std::vector<float>(4, 2.0f)).ok());
  const auto finished = (*writer)->Finish();
  ASSERT_FALSE(finished.ok());
  EXPECT_THAT(finished.status().message(), HasSubstr("cannot fsync"));
  EXPECT_THAT(finished.status().message(), HasSubstr("Input/output error"));
}

// Each write into a slow file takes at least the delay longer (a lower
// bound, so the machine's load cannot break it), and the file is whole.
TEST(FaultInjectingFileSystemTest, ASlowFileDelaysEachWriteAndLosesNothing) {
  const std::string dir = FreshDir("slow");
  FaultInjectingFileSystem faulty = Faulty("slow:model:40");
  const std::vector<float> values(100, 3.0f);
  auto writer = SafetensorsFileWriter::Create(
      dir + "/model.safetensors", {{"a", DType::kFloat32, {100}}, {"b", DType::kFloat32, {100}}},
      {}, &faulty);
  ASSERT_TRUE(writer.ok()) << writer.status();
  const absl::Time start = absl::Now();
  ASSERT_TRUE((*writer)->Append("a", values).ok());
  ASSERT_TRUE((*writer)->Append("b", values).ok());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(80)) << "two writes, 40 ms each at least";
  auto digest = (*writer)->Finish();
  ASSERT_TRUE(digest.ok()) << digest.status();
  EXPECT_EQ(digest->bytes, fs::file_size(dir + "/model.safetensors"));
  EXPECT_GT(digest->bytes, 2 * values.size() * sizeof(float));
  auto parsed = ParseFileFaults("slow:model:40");
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ((*parsed)[0].delay, absl::Milliseconds(40));
}

TEST(FaultInjectingFileSystemTest, BadSpecsAreRefusedNamingThePart) {
  for (const char* spec : {"disk-full", "melt:model", "disk-full:model:lots", "sync-error:m:3",
                           "crash::5", "hang:m:x", "slow:m", "slow:m:soon"}) {
    auto faults = ParseFileFaults(spec);
    ASSERT_FALSE(faults.ok()) << spec;
    EXPECT_EQ(faults.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(faults.status().message(), HasSubstr(std::string("'") + spec + "'")) << spec;
  }
  auto three = ParseFileFaults("disk-full:a:10,crash:b,hang:c:7");
  ASSERT_TRUE(three.ok());
  ASSERT_EQ(three->size(), 3u);
  EXPECT_EQ((*three)[0].after_bytes, 10u);
  EXPECT_EQ((*three)[1].kind, FileFault::Kind::kCrash);
  EXPECT_EQ((*three)[2].kind, FileFault::Kind::kHang);
  EXPECT_EQ((*three)[2].path_contains, "c");
  EXPECT_EQ((*three)[2].after_bytes, 7u);
}

}  // namespace
}  // namespace flatshard
