// The background writes of async saves and their job's abort, on a real
// runtime (rank 0 of two) writing real files: a write that an abort reaches stops
// at its next unit, reports ABORTED and leaves none of its files; a write
// started after the abort writes nothing; a write blocked where the abort
// cannot reach is reported draining and, after the grace, to the watchdog,
// naming the save (the worker then ends itself, abort_watchdog.h); an
// outcome nobody collected goes with the next save, and a write still
// running is stopped by it. The
// file system holds the model file's creation until the test lets it go, so
// the abort lands while the write is known to be in flight, with no sleep.
#include "worker/service/background_saves.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "rpc/status_proto.h"
#include "spdlog/spdlog.h"

#include "core/model_spec_yaml.h"
#include "core/status_macros.h"
#include "storage/safetensors_reader.h"
#include "tests/integration/multiprocess.h"
#include "worker/comm/file_store.h"
#include "worker/device/device_factory.h"
#include "worker/runtime/fsdp_runtime.h"
#include "worker/runtime/shard_checkpoint.h"

namespace flatshard {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr char kModel[] = R"(
root:
  type: Sequential
  children:
    - {name: inp, type: Linear, in_features: 6, out_features: 24}
    - name: blocks
      repeat: 2
      template:
        type: Residual
        children: [{name: fc, type: Linear, in_features: 24, out_features: 24}, {name: act, type: GELU}]
    - {name: out, type: Linear, in_features: 24, out_features: 3}
)";

// The real file system, except that creating the first file whose name
// contains "model" waits until Release (and says it got there); counts the
// bytes appended to every file.
class GatedFileSystem : public FileSystem {
 public:
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    Gate(path);
    ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file,
                     FileSystem::Default()->NewWritableFile(path));
    return std::make_unique<CountedFile>(std::move(file), appended_);
  }
  absl::StatusOr<std::unique_ptr<WritableFile>> OpenSharedFile(const std::string& path,
                                                               uint64_t size) override {
    Gate(path);
    ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file,
                     FileSystem::Default()->OpenSharedFile(path, size));
    return std::make_unique<CountedFile>(std::move(file), appended_);
  }
  absl::Status RemoveFile(const std::string& path) override {
    return FileSystem::Default()->RemoveFile(path);
  }

  uint64_t appended() const { return appended_.load(); }

  // True once a write waits at the gate (within 30 s).
  bool Entered() { return entered_.WaitForNotificationWithTimeout(absl::Seconds(30)); }
  void Release() {
    if (!released_.HasBeenNotified()) released_.Notify();
  }

 private:
  class CountedFile : public WritableFile {
   public:
    CountedFile(std::unique_ptr<WritableFile> file, std::atomic<uint64_t>& appended)
        : file_(std::move(file)), appended_(appended) {}
    absl::Status Append(absl::string_view data) override {
      appended_ += data.size();
      return file_->Append(data);
    }
    absl::Status Seek(uint64_t offset) override { return file_->Seek(offset); }
    absl::Status Sync() override { return file_->Sync(); }
    absl::Status Close() override { return file_->Close(); }

   private:
    std::unique_ptr<WritableFile> file_;
    std::atomic<uint64_t>& appended_;
  };

  void Gate(const std::string& path) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (gated_ || !absl::StrContains(fs::path(path).filename().string(), "model")) return;
      gated_ = true;
    }
    entered_.Notify();
    released_.WaitForNotification();
  }

  std::mutex mu_;
  bool gated_ = false;
  absl::Notification entered_, released_;
  std::atomic<uint64_t> appended_{0};
};

class BackgroundSavesTest : public ::testing::Test {
 protected:
  // Two ranks in this process (a SHARDED save needs a sharded job), each on
  // its own CPU device; the saves write rank 0's shard.
  void SetUp() override {
    dir_ = testing::MakeTempDir("background-saves");
    absl::StatusOr<ModelSpec> parsed = ParseModelSpec(ModelYaml(), "m.yaml");
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    const ModelSpec spec = *std::move(parsed);
    auto store = FileStore::Open(dir_ + "/store");
    ASSERT_TRUE(store.ok()) << store.status();
    auto create = [&](int rank) -> absl::StatusOr<std::unique_ptr<FsdpRuntime>> {
      DeviceOptions device;
      device.kind = DeviceKind::kCpu;
      ASSIGN_OR_RETURN(devices_[rank], CreateDevice(device));
      RuntimeOptions options;
      options.device = devices_[rank];
      options.file_system = &files_;
      options.optimizer.kind = OptimizerKind::kAdam;
      return FsdpRuntime::Create(spec, *ParseWrapPolicy("module-type:Residual"), options, rank, 2,
                                 *store);
    };
    // Both at once: each waits for the other in the rendezvous. spdlog's
    // registry first: its creation, on first use, is guarded inside the
    // uninstrumented library, which ThreadSanitizer cannot see.
    spdlog::default_logger();
    auto peer = std::async(std::launch::async, create, 1);
    auto runtime = create(0);
    auto peer_runtime = peer.get();
    ASSERT_TRUE(runtime.ok()) << runtime.status();
    ASSERT_TRUE(peer_runtime.ok()) << peer_runtime.status();
    runtime_ = *std::move(runtime);
    peer_ = *std::move(peer_runtime);
  }

  virtual const char* ModelYaml() const { return kModel; }

  // A snapshot of the runtime's shards, to be written into `name`.
  ShardSnapshot Snapshot(v1::StateDictType type = v1::SHARDED_STATE_DICT) {
    absl::StatusOr<ShardSnapshot> snapshot = SnapshotShardCheckpoint(*runtime_, type);
    EXPECT_TRUE(snapshot.ok()) << snapshot.status();
    return *std::move(snapshot);
  }
  std::string Dir(const std::string& name) {
    std::string path = absl::StrCat(dir_, "/", name);
    fs::create_directories(path);
    return path;
  }
  static bool Empty(const std::string& path) { return fs::is_empty(path); }

  std::string dir_;
  GatedFileSystem files_;
  std::shared_ptr<Device> devices_[2];
  std::unique_ptr<FsdpRuntime> runtime_, peer_;
};

// Releases the gate when a test ends early, before the saves (which wait for
// their writes) are destroyed: declared after them.
struct ReleaseOnExit {
  GatedFileSystem* files;
  ~ReleaseOnExit() { files->Release(); }
};

// Collects the watchdog's report (there is at most one).
struct Wedged {
  std::promise<std::string> what;
  std::function<void(const std::string&)> Sink() {
    return [this](const std::string& w) { what.set_value(w); };
  }
};

TEST_F(BackgroundSavesTest, AnAbortStopsTheWriteInFlightAndItLeavesNoFiles) {
  AbortWatchdog watchdog(absl::Hours(1), nullptr);
  BackgroundSaves saves(&watchdog);
  ReleaseOnExit release{&files_};
  const std::string dir = Dir("aborted");
  saves.Start("aborted", Snapshot(), dir, 0, 7);
  ASSERT_TRUE(files_.Entered());
  EXPECT_FALSE(saves.DrainingSince().has_value()) << "draining before any abort";
  saves.Abort("recovering from the loss of rank 1");
  EXPECT_TRUE(saves.DrainingSince().has_value());
  files_.Release();
  absl::StatusOr<v1::CommandResult> result = saves.Await("aborted", absl::InfiniteFuture());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->seq(), 7u);
  const absl::Status written = StatusFromProto(result->checkpoint_status());
  EXPECT_EQ(written.code(), absl::StatusCode::kAborted) << written;
  EXPECT_THAT(std::string(written.message()), HasSubstr("the save was aborted after 0 of"));
  EXPECT_EQ(result->files_size(), 0);
  EXPECT_TRUE(Empty(dir)) << "the aborted write left files";
  EXPECT_FALSE(saves.DrainingSince().has_value()) << "a write that returned still drains";
}

// Not even a FULL save's shared file, which its writer would not remove.
TEST_F(BackgroundSavesTest, AWriteStartedAfterTheAbortWritesNothing) {
  files_.Release();  // nothing waits: the gate is open
  for (const v1::StateDictType type : {v1::SHARDED_STATE_DICT, v1::FULL_STATE_DICT}) {
    SCOPED_TRACE(v1::StateDictType_Name(type));
    AbortWatchdog watchdog(absl::Hours(1), nullptr);
    BackgroundSaves saves(&watchdog);
    saves.Abort("re-configured for epoch 3");
    const std::string dir = Dir(absl::StrCat("late-", type));
    saves.Start("late", Snapshot(type), dir, 0, 9);
    absl::StatusOr<v1::CommandResult> result = saves.Await("late", absl::InfiniteFuture());
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(StatusFromProto(result->checkpoint_status()).code(), absl::StatusCode::kAborted);
    EXPECT_TRUE(Empty(dir));
    EXPECT_FALSE(saves.DrainingSince().has_value());
  }
}

TEST_F(BackgroundSavesTest, WithoutAnAbortTheWriteCompletes) {
  files_.Release();
  BackgroundSaves saves;
  const std::string dir = Dir("whole");
  saves.Start("whole", Snapshot(), dir, 0, 4);
  absl::StatusOr<v1::CommandResult> result = saves.Await("whole", absl::InfiniteFuture());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(StatusFromProto(result->checkpoint_status()).ok());
  ASSERT_EQ(result->files_size(), 2);  // model and optimizer
  for (const auto& f : result->files()) {
    EXPECT_EQ(fs::file_size(absl::StrCat(dir, "/", f.name())), f.bytes());
  }
}

TEST_F(BackgroundSavesTest, AWriteThatDoesNotLetGoIsReportedToTheWatchdog) {
  Wedged wedged;
  AbortWatchdog watchdog(absl::Milliseconds(50), wedged.Sink());
  BackgroundSaves saves(&watchdog);
  ReleaseOnExit release{&files_};
  saves.Start("stuck", Snapshot(), Dir("stuck"), 0, 12);
  ASSERT_TRUE(files_.Entered());
  saves.Abort("the coordinator went silent");
  std::future<std::string> report = wedged.what.get_future();
  ASSERT_EQ(report.wait_for(std::chrono::seconds(30)), std::future_status::ready)
      << "the watchdog was not told";
  const std::string what = report.get();
  EXPECT_THAT(what, HasSubstr("async save of batch seq 12 into 'stuck' on rank 0"));
  EXPECT_THAT(what, HasSubstr("(aborted: the coordinator went silent)"));
  EXPECT_TRUE(saves.DrainingSince().has_value());
  files_.Release();  // the write returns, aborted
  absl::StatusOr<v1::CommandResult> result = saves.Await("stuck", absl::InfiniteFuture());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(StatusFromProto(result->checkpoint_status()).code(), absl::StatusCode::kAborted);
}

// A caller that gives up (the coordinator cancelled the AwaitSave call)
// frees the waiting thread without waiting out its deadline, and the save's
// outcome is still there for a later Await.
TEST_F(BackgroundSavesTest, AnAwaitWhoseCallerGivesUpReturnsAndTheOutcomeStays) {
  BackgroundSaves saves;
  ReleaseOnExit release{&files_};
  saves.Start("held", Snapshot(), Dir("held"), 0, 5);
  ASSERT_TRUE(files_.Entered());
  std::atomic<bool> gave_up{false};
  std::future<absl::StatusOr<v1::CommandResult>> waiting = std::async(std::launch::async, [&] {
    return saves.Await("held", absl::InfiniteFuture(), [&] { return gave_up.load(); });
  });
  gave_up.store(true);
  ASSERT_EQ(waiting.wait_for(std::chrono::seconds(30)), std::future_status::ready)
      << "the wait did not notice its caller gave up";
  absl::StatusOr<v1::CommandResult> cancelled = waiting.get();
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kCancelled) << cancelled.status();
  EXPECT_THAT(std::string(cancelled.status().message()), HasSubstr("'held'"));
  files_.Release();
  absl::StatusOr<v1::CommandResult> result =
      saves.Await("held", absl::InfiniteFuture(), [] { return false; });
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->seq(), 5u);
  EXPECT_TRUE(StatusFromProto(result->checkpoint_status()).ok());
}

// An outcome is there for as many Awaits as ask, until the next save: the
// call that carried it may be lost (the coordinator's wait is cut into short
// calls, and one's deadline can pass as the write ends), and the coordinator
// asks again.
TEST_F(BackgroundSavesTest, AnOutcomeIsAnsweredAgainUntilTheNextSave) {
  files_.Release();
  BackgroundSaves saves;
  saves.Start("twice", Snapshot(), Dir("twice"), 0, 4);
  absl::StatusOr<v1::CommandResult> first = saves.Await("twice", absl::InfiniteFuture());
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<v1::CommandResult> again = saves.Await("twice", absl::InfiniteFuture());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->seq(), 4u);
  EXPECT_EQ(again->files_size(), first->files_size());
  EXPECT_EQ(again->SerializeAsString(), first->SerializeAsString());
  saves.Start("later", Snapshot(), Dir("later"), 0, 5);
  EXPECT_EQ(saves.Await("twice", absl::InfiniteFuture()).status().code(),
            absl::StatusCode::kNotFound);
}

// An outcome nobody collected (the coordinator abandoned that commit with its
// job) goes with the next save: the coordinator starts one only after it
// collected or gave up every earlier one.
TEST_F(BackgroundSavesTest, TheNextSaveDropsAnOutcomeNobodyCollected) {
  files_.Release();
  BackgroundSaves saves;
  saves.Start("abandoned", Snapshot(), Dir("abandoned"), 0, 3);
  saves.Start("next", Snapshot(), Dir("next"), 0, 6);
  const absl::StatusOr<v1::CommandResult> abandoned =
      saves.Await("abandoned", absl::InfiniteFuture());
  EXPECT_EQ(abandoned.status().code(), absl::StatusCode::kNotFound) << abandoned.status();
  absl::StatusOr<v1::CommandResult> next = saves.Await("next", absl::InfiniteFuture());
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->seq(), 6u);
  EXPECT_TRUE(StatusFromProto(next->checkpoint_status()).ok());
}

// A write still running when the next save starts is one the coordinator
// gave up on (its checkpoint failed on another rank): the next save stops it
// at its next tensor, rather than wait (holding the batch) for the rest of
// its write. Its epoch is healthy, so the watchdog is not told: one slow
// piece of a healthy write must not end the worker.
TEST_F(BackgroundSavesTest, TheNextSaveStopsAWriteNobodyWillCollect) {
  Wedged wedged;
  AbortWatchdog watchdog(absl::Milliseconds(1), wedged.Sink());
  BackgroundSaves saves(&watchdog);
  ReleaseOnExit release{&files_};
  const std::string given_up = Dir("given-up");
  saves.Start("given-up", Snapshot(), given_up, 0, 3);
  ASSERT_TRUE(files_.Entered());
  ShardSnapshot next_snapshot = Snapshot();
  std::thread next([&] { saves.Start("next", std::move(next_snapshot), Dir("next"), 0, 6); });
  // A bounded poll of the condition: the next save has stopped the write.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (saves.StoppedWritesRunning() == 0 && absl::Now() < deadline) std::this_thread::yield();
  EXPECT_EQ(saves.StoppedWritesRunning(), 1u) << "the next save did not stop the write";
  EXPECT_FALSE(saves.DrainingSince().has_value()) << "a stopped write of a healthy epoch drains";
  files_.Release();  // the stopped write returns at its next tensor
  next.join();
  EXPECT_EQ(saves.StoppedWritesRunning(), 0u);
  EXPECT_TRUE(Empty(given_up)) << "the stopped write left files";
  absl::StatusOr<v1::CommandResult> result = saves.Await("next", absl::InfiniteFuture());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->seq(), 6u);
  EXPECT_TRUE(StatusFromProto(result->checkpoint_status()).ok());
  EXPECT_EQ(result->files_size(), 2);
  EXPECT_EQ(wedged.what.get_future().wait_for(std::chrono::seconds(0)), std::future_status::timeout)
      << "the watchdog was told of a healthy epoch's write";
}

// One Linear whose weight, sharded over the two ranks, is 2 Mi elements (8 MiB)
// on rank 0: more than two of a save's writes (kSaveWriteChunk).
constexpr char kBigModel[] = R"(
root:
  type: Sequential
  children:
    - {name: big, type: Linear, in_features: 1024, out_features: 4096}
)";

class BigTensorSavesTest : public BackgroundSavesTest {
 protected:
  const char* ModelYaml() const override { return kBigModel; }
};

// A tensor's part is written a chunk at a time, the abort asked before each:
// an aborted save lets go within one chunk of writing, not one tensor.
TEST_F(BigTensorSavesTest, AnAbortLetsGoWithinAChunkOfATensor) {
  files_.Release();
  const ShardSnapshot snapshot = Snapshot();
  const std::string dir = Dir("chunked");
  int asked = 0;
  uint64_t at_abort = 0;
  // Asked before the files are created, before the first piece (the
  // weight's part), then before its second chunk: stopped there.
  const absl::StatusOr<ShardSaveResult> saved = WriteShardSnapshot(snapshot, dir, [&] {
    if (++asked < 3) return false;
    at_abort = files_.appended();
    return true;
  });
  EXPECT_EQ(saved.status().code(), absl::StatusCode::kAborted) << saved.status();
  EXPECT_EQ(asked, 3);
  const uint64_t chunk_bytes = kSaveWriteChunk * sizeof(float);
  EXPECT_GE(at_abort, chunk_bytes) << "the first chunk was not written";
  // The chunk and the two files' headers, not the weight's whole 8 MiB.
  EXPECT_LT(at_abort, chunk_bytes + (64u << 10)) << "written past one chunk before the abort";
  EXPECT_TRUE(Empty(dir)) << "the aborted write left files";
  // Not stopped, the chunks make the same tensors as one write would.
  const std::string whole = Dir("whole");
  const absl::StatusOr<ShardSaveResult> written = WriteShardSnapshot(snapshot, whole);
  ASSERT_TRUE(written.ok()) << written.status();
  ASSERT_TRUE(written->write_status.ok()) << written->write_status;
  ASSERT_EQ(written->files.size(), 2u);
  for (const CheckpointFile& f : written->files) {
    EXPECT_EQ(fs::file_size(absl::StrCat(whole, "/", f.name)), f.bytes);
    if (!absl::StrContains(f.name, "model")) continue;
    // Rank 0's shard starts with the weight: its part, chunk after chunk.
    absl::StatusOr<std::unique_ptr<SafetensorsReader>> file =
        SafetensorsReader::Open(absl::StrCat(whole, "/", f.name));
    ASSERT_TRUE(file.ok()) << file.status();
    const uint64_t count = 2 * kSaveWriteChunk + 5;
    absl::StatusOr<std::vector<float>> weight = (*file)->ReadFloats("big.weight", 0, count);
    ASSERT_TRUE(weight.ok()) << weight.status();
    absl::StatusOr<std::span<const float>> shard = snapshot.units[0].shard.Read<float>();
    ASSERT_TRUE(shard.ok()) << shard.status();
    ASSERT_GE(shard->size(), count);
    EXPECT_TRUE(std::equal(weight->begin(), weight->end(), shard->begin()))
        << "the chunks did not write the shard's elements in order";
  }
}

}  // namespace
}  // namespace flatshard
