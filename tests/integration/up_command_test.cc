// `flatshard up` as a user runs it: the real binary, its daemons and its
// output. A stop signal saves a job whose step its newest checkpoint does
// not hold before the daemons stop (they hold the only copy of those steps), and the
// next `up` on the same state dir continues from that save; a job the
// cluster could not seat is refused before anything starts.
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

#include "client/child_process.h"
#include "client/flatshard_client.h"
#include "tests/integration/multiprocess.h"
#include "tests/integration/scratch_tmpfs.h"
#include "tests/integration/up_process.h"

namespace flatshard {
namespace {

using testing::ClientOf;
using testing::ExitStatus;
using testing::FrozenWorker;
using ::testing::HasSubstr;
using testing::JobFile;
using ::testing::Not;
using testing::ReadUntil;
using testing::StartUp;
using testing::UpFlags;
using testing::WorkerPid;
using testing::WrappedDaemons;

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
            "saving job 'mlp-demo' (step 3; a restart would restore its initialization, not this "
            "state) as 'stop-"));
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

// Started, trained 3 steps (past its checkpoint: there is none) and one
// worker frozen, so that the save before stopping waits for it.
struct TrainedUp {
  std::unique_ptr<ChildProcess> up;
  std::unique_ptr<FrozenWorker> frozen;
};
TrainedUp StartTrainedWithAFrozenWorker(const std::vector<std::string>& flags,
                                        const std::string& address_file) {
  TrainedUp t;
  t.up = StartUp(flags);
  if (t.up == nullptr) return t;
  const std::string started = ReadUntil(*t.up, "The cluster is up");
  EXPECT_THAT(started, HasSubstr("job 'mlp-demo' is READY at step 0")) << started;
  FlatshardClient client = ClientOf(address_file);
  EXPECT_TRUE(client.Train("mlp-demo", 3, 0, [](const v1::StepResult&) {}).ok());
  const pid_t worker = WorkerPid(*t.up, "worker-1");
  EXPECT_GT(worker, 0);
  if (worker > 0) t.frozen = std::make_unique<FrozenWorker>(worker);
  return t;
}

// A save that outlasts --stop-save-timeout is given up, `up` says the steps
// since the checkpoint are lost and exits 1, and nothing half-saved is
// taken for a checkpoint by the next start.
TEST(UpCommandTest, AStopSaveThatOutlastsItsTimeoutIsGivenUpAndTheExitSaysSo) {
  const std::string dir = testing::MakeTempDir("up-save-timeout");
  const std::string address_file = dir + "/address";
  std::vector<std::string> flags = UpFlags(dir, address_file);
  {
    std::vector<std::string> with_timeout = flags;
    with_timeout.insert(with_timeout.end(), {"--stop-save-timeout", "1"});
    TrainedUp t = StartTrainedWithAFrozenWorker(with_timeout, address_file);
    ASSERT_NE(t.frozen, nullptr);
    t.up->Signal(SIGINT);
    const std::string stopped = ReadUntil(*t.up, "stopped");
    EXPECT_THAT(stopped, HasSubstr("saving job 'mlp-demo' (step 3"));
    EXPECT_THAT(stopped,
                HasSubstr("the save did not finish in 1s (--stop-save-timeout); stopping without "
                          "it: what it had not saved is lost"));
    EXPECT_THAT(stopped, Not(HasSubstr("' at step 3 (")));
    // The frozen worker was continued with its SIGTERM and stopped by itself.
    EXPECT_THAT(stopped, HasSubstr("stopped cleanly")) << stopped;
    EXPECT_EQ(ExitStatus(*t.up), 1);
  }
  std::unique_ptr<ChildProcess> up = StartUp(flags);
  ASSERT_NE(up, nullptr);
  const std::string started = ReadUntil(*up, "The cluster is up");
  EXPECT_THAT(started, HasSubstr("job 'mlp-demo' is READY at step 0")) << started;
  auto checkpoints = ClientOf(address_file).ListCheckpoints("mlp-demo");
  ASSERT_TRUE(checkpoints.ok()) << checkpoints.status();
  EXPECT_TRUE(checkpoints->empty()) << (*checkpoints)[0].name();
  up->Signal(SIGTERM);
  EXPECT_THAT(ReadUntil(*up, "stopped"), HasSubstr("stopped cleanly"));
  EXPECT_EQ(ExitStatus(*up), 0);
}

// A second Ctrl-C while the save waits stops waiting for it.
TEST(UpCommandTest, ASecondCtrlCStopsWithoutWaitingForTheSave) {
  const std::string dir = testing::MakeTempDir("up-second-ctrl-c");
  const std::string address_file = dir + "/address";
  TrainedUp t = StartTrainedWithAFrozenWorker(UpFlags(dir, address_file), address_file);
  ASSERT_NE(t.frozen, nullptr);
  t.up->Signal(SIGINT);
  const std::string saving = ReadUntil(*t.up, "(Ctrl-C again to stop without saving)");
  ASSERT_THAT(saving, HasSubstr("(Ctrl-C again to stop without saving)"));
  t.up->Signal(SIGINT);
  const std::string stopped = ReadUntil(*t.up, "stopped");
  EXPECT_THAT(stopped, HasSubstr("Interrupt again: stopping without waiting for the save: what "
                                 "it had not saved is lost"));
  EXPECT_THAT(stopped, Not(HasSubstr("' at step 3 (")));
  EXPECT_THAT(stopped, HasSubstr("stopped cleanly")) << stopped;
  EXPECT_EQ(ExitStatus(*t.up), 1);
}

// A save that fails (the checkpoint dir is a full disk: a small tmpfs) says
// why and where the next start continues, and `up` exits 1. Needs
// CAP_SYS_ADMIN to mount (root in CI); skipped with the reason elsewhere.
TEST(UpCommandTest, AStopSaveThatFailsSaysWhereTheNextUpContinues) {
  const std::string dir = testing::MakeTempDir("up-save-fails");
  const std::string checkpoints = dir + "/checkpoints";
  auto full_disk = testing::ScratchTmpfs::Mount(checkpoints, "64k");
  if (!full_disk.ok()) GTEST_SKIP() << full_disk.status().message();
  const std::string address_file = dir + "/address";
  std::vector<std::string> flags = UpFlags(dir, address_file);
  flags.insert(flags.end(), {"--state-dir", dir + "/state"});  // off the full disk
  std::unique_ptr<ChildProcess> up = StartUp(flags);
  ASSERT_NE(up, nullptr);
  ReadUntil(*up, "The cluster is up");
  ASSERT_TRUE(ClientOf(address_file).Train("mlp-demo", 2, 0, [](const v1::StepResult&) {}).ok());
  up->Signal(SIGTERM);
  const std::string stopped = ReadUntil(*up, "stopped");
  EXPECT_THAT(stopped, HasSubstr("saving job 'mlp-demo' (step 2"));
  EXPECT_THAT(stopped, HasSubstr("  not saved: "));
  EXPECT_THAT(stopped, HasSubstr("No space left on device"));
  EXPECT_THAT(stopped, HasSubstr("; the next `flatshard up` on this state dir continues it from "
                                 "step 0 (its initialization)"));
  EXPECT_THAT(stopped, HasSubstr("stopped cleanly")) << stopped;
  EXPECT_EQ(ExitStatus(*up), 1);
}

// A shell runs a background command with SIGINT ignored, and a launcher may
// pass SIGTERM on ignored: the daemons still stop, since they block both
// for sigwait and Linux queues a blocked signal whatever its action.
TEST(UpCommandTest, DaemonsStartedWithStopSignalsIgnoredStillStop) {
  const std::string dir = testing::MakeTempDir("up-ignored");
  const std::string ignoring = "trap '' INT TERM\nexec \"$DAEMON\" \"$@\"";
  const std::string bin = WrappedDaemons(dir, ignoring, ignoring);
  std::unique_ptr<ChildProcess> up =
      StartUp({"--workers", "2", "--checkpoint-dir", dir + "/checkpoints", "--bin-dir", bin});
  ASSERT_NE(up, nullptr);
  ASSERT_THAT(ReadUntil(*up, "The cluster is up"), HasSubstr("The cluster is up"));
  up->Signal(SIGINT);
  EXPECT_THAT(ReadUntil(*up, "stopped"), HasSubstr("stopped cleanly"));
  EXPECT_EQ(ExitStatus(*up), 0);
}

// Daemons that will not stop (here each is run by a shell that ignores the
// SIGTERM sent to it) are killed at once by a Ctrl-C while `up` waits for
// them, not after their grace. The real daemon dies with its shell
// (--pdeathsig), so nothing is left behind.
TEST(UpCommandTest, ACtrlCWhileStoppingKillsDaemonsThatWillNotStop) {
  const std::string dir = testing::MakeTempDir("up-will-not-stop");
  // The shell dies with `up` however `up` ends (its own death signal, KILL,
  // in place of the SIGTERM it ignores), and the daemon with the shell.
  const std::string will_not_stop =
      "exec setpriv --pdeathsig KILL -- /bin/sh -c "
      "'trap \"\" TERM; setpriv --pdeathsig KILL -- \"$0\" \"$@\" & wait $!' \"$DAEMON\" \"$@\"";
  const std::string bin = WrappedDaemons(dir, will_not_stop, will_not_stop);
  std::unique_ptr<ChildProcess> up =
      StartUp({"--workers", "2", "--checkpoint-dir", dir + "/checkpoints", "--bin-dir", bin,
               "--stop-save-timeout", "0"});
  ASSERT_NE(up, nullptr);
  ASSERT_THAT(ReadUntil(*up, "The cluster is up"), HasSubstr("The cluster is up"));
  up->Signal(SIGINT);
  ASSERT_THAT(ReadUntil(*up, "stopping the cluster"),
              HasSubstr("stopping the cluster... (Ctrl-C again to kill the daemons now)"));
  const absl::Time second = absl::Now();
  up->Signal(SIGINT);
  const std::string stopped = ReadUntil(*up, "stopped");
  EXPECT_THAT(stopped, HasSubstr("Interrupt again: killing the daemons"));
  EXPECT_THAT(stopped, HasSubstr("stopped (some daemons had to be killed)")) << stopped;
  EXPECT_EQ(ExitStatus(*up), 1);
  // Not the 10 s grace each stop would otherwise have waited out.
  EXPECT_LT(absl::Now() - second, absl::Seconds(8));
}

TEST(UpCommandTest, AJobLargerThanTheClusterIsRefusedBeforeAnythingStarts) {
  const std::string dir = testing::MakeTempDir("up-refused");
  // Its words are on stderr: through a shell that sends them to stdout.
  std::unique_ptr<ChildProcess> up = StartUp(
      {"--workers", "1", "--job", JobFile(dir), "--checkpoint-dir", dir + "/checkpoints"}, true);
  ASSERT_NE(up, nullptr);
  const std::string said = ReadUntil(*up, "world_size");
  EXPECT_THAT(said, HasSubstr("world_size 2 needs 2 workers and --workers is 1")) << said;
  EXPECT_THAT(said, Not(HasSubstr("starting a coordinator")));
  EXPECT_EQ(ExitStatus(*up), 2);
}

}  // namespace
}  // namespace flatshard
