// `flatshard up` as a user runs it: the real binary, its daemons and its
// output. A stop signal saves a job whose step its newest checkpoint does
// not hold before the daemons stop (they hold the only copy of those steps), and the
// next `up` on the same state dir continues from that save; a job the
// cluster could not seat is refused before anything starts.
#include <csignal>
#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

#include "client/child_process.h"
#include "client/flatshard_client.h"
#include "tests/integration/multiprocess.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The example MLP job at world size 2 (beside the model file it names).
std::string JobFile(const std::string& dir) {
  std::ofstream(dir + "/mlp.yaml")
      << ReadAll(std::string(FLATSHARD_SOURCE_DIR) + "/examples/mlp.yaml");
  const std::string example = ReadAll(std::string(FLATSHARD_SOURCE_DIR) + "/examples/mlp-job.yaml");
  EXPECT_THAT(example, HasSubstr("world_size: 4\n"));
  std::string path = dir + "/job.yaml";
  std::ofstream(path) << absl::StrReplaceAll(example, {{"world_size: 4\n", "world_size: 2\n"}});
  return path;
}

// One `flatshard up` with `flags`; its stdout is read line by line.
std::unique_ptr<ChildProcess> StartUp(const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {std::string(FLATSHARD_BIN_DIR) + "/flatshard", "up"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  auto up = ChildProcess::Spawn(argv);
  EXPECT_TRUE(up.ok()) << up.status();
  return up.ok() ? *std::move(up) : nullptr;
}

// Its output up to and including the first line holding `text` (all of it
// if it exits or 120 s pass first).
std::string ReadUntil(ChildProcess& up, const std::string& text) {
  std::string said;
  absl::StatusOr<std::string> line;
  while ((line = up.ReadLine(absl::Seconds(120))).ok()) {
    said += *line + "\n";
    if (line->find(text) != std::string::npos) break;
  }
  return said;
}

// Two workers and the job at world size 2, everything under `dir`.
std::vector<std::string> UpFlags(const std::string& dir, const std::string& address_file) {
  return {"--workers",          "2",          "--job", JobFile(dir),     "--checkpoint-dir",
          dir + "/checkpoints", "--data-dir", dir,     "--address-file", address_file};
}

// A client of the coordinator `up` wrote into `address_file`.
FlatshardClient ClientOf(const std::string& address_file) {
  return FlatshardClient(std::string(absl::StripTrailingAsciiWhitespace(ReadAll(address_file))));
}

int ExitStatus(ChildProcess& process) {
  const std::optional<int> status = process.Wait(absl::Seconds(60));
  return status.has_value() && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1;
}

TEST(UpCommandTest, AStopSignalSavesTheJobAndTheNextUpContinuesFromIt) {
  const std::string dir = testing::MakeTempDir("up-save");
  const std::string address_file = dir + "/address";
  const std::vector<std::string> flags = UpFlags(dir, address_file);
  {
    std::unique_ptr<ChildProcess> up = StartUp(flags);
    ASSERT_NE(up, nullptr);
    const std::string started = ReadUntil(*up, "The cluster is up");
    ASSERT_THAT(started, HasSubstr("job 'mlp-demo' is READY at step 0")) << started;
    FlatshardClient client = ClientOf(address_file);
    ASSERT_TRUE(client.Train("mlp-demo", 3, 0, [](const v1::StepResult&) {}).ok());
    up->Signal(SIGINT);
    const std::string stopped = ReadUntil(*up, "stopped cleanly");
    EXPECT_THAT(
        stopped,
        HasSubstr(
            "saving job 'mlp-demo' (step 3, which its newest checkpoint does not hold) as 'stop-"));
    EXPECT_THAT(stopped, HasSubstr("' at step 3 ("));
    EXPECT_THAT(stopped, HasSubstr("stopped cleanly")) << stopped;
    EXPECT_EQ(ExitStatus(*up), 0);
  }
  // The same state dir: the workers come back under their ids (their seats'
  // secrets) and the job goes on from the save, not from step 0.
  std::unique_ptr<ChildProcess> up = StartUp(flags);
  ASSERT_NE(up, nullptr);
  const std::string started = ReadUntil(*up, "The cluster is up");
  EXPECT_THAT(started, HasSubstr("job 'mlp-demo' is in the state dir: continuing it"));
  EXPECT_THAT(started, HasSubstr("job 'mlp-demo' is READY at step 3")) << started;
  FlatshardClient client = ClientOf(address_file);
  auto checkpoints = client.ListCheckpoints("mlp-demo");
  ASSERT_TRUE(checkpoints.ok()) << checkpoints.status();
  ASSERT_EQ(checkpoints->size(), 1u);
  EXPECT_THAT((*checkpoints)[0].name(), ::testing::StartsWith("stop-"));
  EXPECT_EQ((*checkpoints)[0].step(), 3);
  // Nothing trained since: nothing to save.
  up->Signal(SIGTERM);
  const std::string stopped = ReadUntil(*up, "stopped cleanly");
  EXPECT_THAT(stopped, Not(HasSubstr("saving job")));
  EXPECT_THAT(stopped, HasSubstr("stopped cleanly")) << stopped;
  EXPECT_EQ(ExitStatus(*up), 0);
}

// Stopped while a training runs on the coordinator (detached): the save
// goes in between two steps, and the coordinator stops before the workers,
// so the job is kept as it was rather than failed by workers going away
// under a batch (a recovery spent, a shrunk or FAILED job for the next start).
TEST(UpCommandTest, StoppedWhileTrainingItSavesBetweenStepsAndKeepsTheJob) {
  const std::string dir = testing::MakeTempDir("up-training");
  const std::string address_file = dir + "/address";
  const std::vector<std::string> flags = UpFlags(dir, address_file);
  int64_t saved_step = -1;
  {
    std::unique_ptr<ChildProcess> up = StartUp(flags);
    ASSERT_NE(up, nullptr);
    ReadUntil(*up, "The cluster is up");
    FlatshardClient client = ClientOf(address_file);
    v1::TrainRequest train;
    train.set_job("mlp-demo");
    train.set_steps(1000000);
    train.set_detach(true);
    ASSERT_TRUE(client.Train(train, [](const v1::StepResult&) {}).ok());
    // Bounded polls of a condition: the training is past step 5.
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (absl::Now() < deadline) {
      auto job = client.GetJob("mlp-demo");
      if (job.ok() && job->step() >= 5) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
    up->Signal(SIGINT);
    const std::string stopped = ReadUntil(*up, "stopped cleanly");
    const size_t at = stopped.find("' at step ");
    ASSERT_NE(at, std::string::npos) << stopped;
    saved_step = std::stoll(stopped.substr(at + std::string("' at step ").size()));
    EXPECT_GE(saved_step, 5);
    EXPECT_THAT(stopped, HasSubstr("stopped cleanly")) << stopped;
    EXPECT_EQ(ExitStatus(*up), 0);
  }
  std::unique_ptr<ChildProcess> up = StartUp(flags);
  ASSERT_NE(up, nullptr);
  const std::string started = ReadUntil(*up, "The cluster is up");
  EXPECT_THAT(started, HasSubstr(absl::StrCat("job 'mlp-demo' is READY at step ", saved_step)))
      << started;
  FlatshardClient client = ClientOf(address_file);
  auto job = client.GetJob("mlp-demo");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->world_size(), 2);
  // The one recovery is this start's rollback to the save; a stop that
  // failed a batch would have recorded its own first.
  EXPECT_EQ(job->restarts(), 1) << job->last_recovery().cause();
  EXPECT_THAT(job->last_recovery().cause(), ::testing::StartsWith("the coordinator restarted"));
  up->Signal(SIGTERM);
  ReadUntil(*up, "stopped cleanly");
  EXPECT_EQ(ExitStatus(*up), 0);
}

TEST(UpCommandTest, AJobLargerThanTheClusterIsRefusedBeforeAnythingStarts) {
  const std::string dir = testing::MakeTempDir("up-refused");
  // Its words are on stderr: through a shell that sends them to stdout.
  auto up = ChildProcess::Spawn(
      {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1", std::string(FLATSHARD_BIN_DIR) + "/flatshard",
       "up", "--workers", "1", "--job", JobFile(dir), "--checkpoint-dir", dir + "/checkpoints"});
  ASSERT_TRUE(up.ok()) << up.status();
  const std::string said = ReadUntil(**up, "world_size");
  EXPECT_THAT(said, HasSubstr("world_size 2 needs 2 workers and --workers is 1")) << said;
  EXPECT_THAT(said, Not(HasSubstr("starting a coordinator")));
  EXPECT_EQ(ExitStatus(**up), 2);
}

}  // namespace
}  // namespace flatshard
