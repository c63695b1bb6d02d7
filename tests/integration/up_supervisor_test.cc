// `flatshard up` as its daemons' supervisor (client/up_supervisor.h), the
// real binary and its real daemons: a coordinator that fails is started
// again, whether the job is READY yet or not, and takes its job back; a
// worker that ended itself wedged is started again; each up to its restart
// limit; a Ctrl-C is heard while a daemon restarts. (One test drives the
// supervisor itself over a cluster of real daemons, to order what `up`'s
// signal loop cannot be made to order.)
#include "client/up_supervisor.h"

#include <cerrno>
#include <csignal>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

#include "client/child_process.h"
#include "client/flatshard_client.h"
#include "client/local_cluster.h"
#include "tests/integration/multiprocess.h"
#include "tests/integration/up_process.h"

namespace flatshard {
namespace {

using testing::ClientOf;
using testing::CoordinatorPid;
using testing::ExitStatus;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::ReadAll;
using testing::ReadUntil;
using testing::StartUp;
using testing::UpFlags;
using testing::WorkerPid;
using testing::WrappedDaemons;

// Wrapped daemons' bodies (WrappedDaemons): the real one, and a worker
// whose shell exits 3 (ended itself wedged) once the real daemon is killed.
// Each shell dies with its parent (--pdeathsig), so nothing outlives a
// failing test.
constexpr char kRealDaemon[] = "exec \"$DAEMON\" \"$@\"";
constexpr char kWedgesOnceKilled[] =
    "exec setpriv --pdeathsig KILL -- /bin/sh -c "
    "'setpriv --pdeathsig KILL -- \"$0\" \"$@\"; exit 3' \"$DAEMON\" \"$@\"";

// SIGKILLs worker-0's real daemon: the child of its shell (kWedgesOnceKilled).
void KillTheWrappedWorker(const ChildProcess& up) {
  const pid_t shell = WorkerPid(up, "worker-0");
  ASSERT_GT(shell, 0);
  pid_t worker = -1;
  std::istringstream(ReadAll(absl::StrCat("/proc/", shell, "/task/", shell, "/children"))) >>
      worker;
  ASSERT_GT(worker, 0);  // kill(-1) would reach every process
  kill(worker, SIGKILL);
}

// Sends `signal` to `up`'s coordinator daemon.
void SignalTheCoordinator(const ChildProcess& up, int signal) {
  const pid_t coordinator = CoordinatorPid(up);
  ASSERT_GT(coordinator, 0);  // kill(-1) would reach every process
  kill(coordinator, signal);
}

// A FIFO a wrapped daemon waits on (`read go < PATH`) until Open(). This
// end is held open for reading and writing from the start, so neither the
// wrapper's open nor Open() blocks: a wrapper that died (a failing `up`)
// leaves the test failing, not hanging.
class Gate {
 public:
  explicit Gate(const std::string& dir) : path_(dir + "/gate") {
    EXPECT_EQ(mkfifo(path_.c_str(), 0600), 0) << strerror(errno);
    fd_ = open(path_.c_str(), O_RDWR | O_CLOEXEC);  // Linux: never blocks on a FIFO
    EXPECT_GE(fd_, 0) << strerror(errno);
  }
  ~Gate() { close(fd_); }
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;

  const std::string& path() const { return path_; }
  void Open() const { EXPECT_EQ(write(fd_, "go\n", 3), 3) << strerror(errno); }

 private:
  std::string path_;
  int fd_ = -1;
};

// `up --job` (the job at world size 2) whose worker-1 says it listens, then
// waits on `gate` before it starts the real daemon: the job waits for it.
// Returned once `up` has created the job and waits for it to be READY.
std::unique_ptr<ChildProcess> StartUpWithWorker1Held(const std::string& dir, const Gate& gate,
                                                     const std::string& address_file) {
  const std::string bin = WrappedDaemons(
      dir,
      absl::StrCat("case \" $* \" in *\" worker-1 \"*)\n"
                   "  echo 'flatshard-worker worker-1 rank 1 listening on 127.0.0.1:1, metrics on "
                   "127.0.0.1:1'\n"
                   "  read go < ",
                   gate.path(), " ;;\nesac\n", kRealDaemon),
      kRealDaemon);
  std::vector<std::string> flags = UpFlags(dir, address_file);
  flags.insert(flags.end(), {"--bin-dir", bin});
  std::unique_ptr<ChildProcess> up = StartUp(flags, true);
  if (up == nullptr) return nullptr;
  const std::string said = ReadUntil(*up, "waiting for it to be READY");
  if (said.find("job 'mlp-demo' created; waiting for it to be READY") == std::string::npos) {
    ADD_FAILURE() << "the job was not created, or is READY without worker-1: " << said;
    return nullptr;
  }
  return up;
}

// `up` as the coordinator's supervisor: one that fails (kill -9) is started
// again on the same address and takes its job back where it was, and
// training goes on; past the restart limit the cluster stops, exiting 1.
TEST(UpSupervisorTest, AFailedCoordinatorIsStartedAgainAndTakesItsJobBack) {
  const std::string dir = testing::MakeTempDir("up-coordinator-fails");
  const std::string address_file = dir + "/address";
  std::unique_ptr<ChildProcess> spawned = StartUp(UpFlags(dir, address_file), true);
  ASSERT_NE(spawned, nullptr);
  ChildProcess& up = *spawned;
  ASSERT_THAT(ReadUntil(up, "The cluster is up"), HasSubstr("The cluster is up"));
  FlatshardClient client = ClientOf(address_file);
  const std::string address(absl::StripTrailingAsciiWhitespace(ReadAll(address_file)));
  ASSERT_TRUE(client.Train("mlp-demo", 3, 0, [](const v1::StepResult&) {}).ok());

  for (int restart = 1; restart <= 3; ++restart) {
    ASSERT_NO_FATAL_FAILURE(SignalTheCoordinator(up, SIGKILL));
    const std::string said = ReadUntil(up, "coordinator: back on");
    EXPECT_THAT(said, HasSubstr(absl::StrCat("the coordinator failed (killed by signal 9, Killed); "
                                             "starting it again on ",
                                             address, " (restart ", restart,
                                             " of the 3 allowed within 10m)")));
    ASSERT_THAT(said, HasSubstr("coordinator: back on")) << said;
    // The job where it was, and training goes on (through the same address).
    auto ready = client.WaitForState("mlp-demo", {v1::READY}, absl::Seconds(120));
    ASSERT_TRUE(ready.ok()) << ready.status();
    auto job = client.GetJob("mlp-demo");
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(job->step(), restart + 2);
    ASSERT_TRUE(client.Train("mlp-demo", 1, 0, [](const v1::StepResult&) {}).ok());
  }
  ASSERT_NO_FATAL_FAILURE(SignalTheCoordinator(up, SIGKILL));
  const std::string stopped = ReadUntil(up, "stopped (");
  EXPECT_THAT(stopped, HasSubstr("the coordinator failed (killed by signal 9, Killed) after 3 "
                                 "restarts within 10m; stopping the cluster"));
  EXPECT_THAT(stopped, HasSubstr("the coordinator is gone"));
  // It killed nothing: the coordinator had exited, the workers stop cleanly.
  EXPECT_THAT(stopped, HasSubstr("stopped (not every daemon exited cleanly"));
  EXPECT_EQ(ExitStatus(up), 1);
}

// A coordinator stopped on purpose (exit 0, here its SIGTERM) is not
// started again: the cluster stops, and `up` exits 1.
TEST(UpSupervisorTest, ACoordinatorStoppedOnPurposeEndsTheCluster) {
  const std::string dir = testing::MakeTempDir("up-coordinator-stopped");
  std::unique_ptr<ChildProcess> up =
      StartUp({"--workers", "1", "--checkpoint-dir", dir + "/checkpoints"}, true);
  ASSERT_NE(up, nullptr);
  ASSERT_THAT(ReadUntil(*up, "The cluster is up"), HasSubstr("The cluster is up"));
  ASSERT_NO_FATAL_FAILURE(SignalTheCoordinator(*up, SIGTERM));
  const std::string stopped = ReadUntil(*up, "stopped cleanly");
  EXPECT_THAT(stopped, HasSubstr("the coordinator exited (exit status 0: stopped on purpose); "
                                 "stopping the cluster"));
  EXPECT_THAT(stopped, Not(HasSubstr("starting it again")));
  EXPECT_THAT(stopped, HasSubstr("stopped cleanly")) << stopped;
  EXPECT_EQ(ExitStatus(*up), 1);
}

// `up` as the workers' supervisor: a worker that ends itself wedged (exit
// status 3; here a shell around the real daemon exits 3 once the daemon is
// killed) is started again, 3 times within 10 minutes; the fourth time it
// stays down, and `up` says so.
TEST(UpSupervisorTest, AWedgedWorkerIsRestartedUpToItsLimitThenStaysDown) {
  const std::string dir = testing::MakeTempDir("up-wedged");
  const std::string bin = WrappedDaemons(dir, kWedgesOnceKilled, kRealDaemon);
  std::unique_ptr<ChildProcess> spawned =
      StartUp({"--workers", "1", "--checkpoint-dir", dir + "/checkpoints", "--bin-dir", bin}, true);
  ASSERT_NE(spawned, nullptr);
  ChildProcess& up = *spawned;
  ASSERT_THAT(ReadUntil(up, "The cluster is up"), HasSubstr("The cluster is up"));
  const auto kill_the_worker = [&up] { KillTheWrappedWorker(up); };
  for (int restart = 1; restart <= 3; ++restart) {
    ASSERT_NO_FATAL_FAILURE(kill_the_worker());
    EXPECT_THAT(ReadUntil(up, "ended itself wedged"),
                HasSubstr(absl::StrCat("worker-0 ended itself wedged (exit status 3); started it "
                                       "again (restart ",
                                       restart, " of the 3 allowed within 10m)")));
  }
  ASSERT_NO_FATAL_FAILURE(kill_the_worker());
  EXPECT_THAT(ReadUntil(up, "stays down"),
              HasSubstr("up: worker-0 ended itself wedged again, after 3 restarts within 10m; it "
                        "stays down"));
  EXPECT_EQ(WorkerPid(up, "worker-0"), -1) << "not started again";
  // Its only worker down for good: up stops, failed, by itself.
  EXPECT_THAT(ReadUntil(up, "not saved"),
              HasSubstr("every worker has exited and none is to be started again: stopping"));
  EXPECT_EQ(ExitStatus(up), 1);
}

// A worker that ended itself wedged after the supervisor last looked (its
// SIGCHLD still pending, as when it exits between `up`'s OnChildExit and
// its EveryWorkerGone) is not gone for good: the SIGCHLD restarts it.
// The supervisor over a LocalCluster in this process, of real daemons.
TEST(UpSupervisorTest, AWorkerWedgedSinceTheLastLookIsNotGoneForGood) {
  const std::string dir = testing::MakeTempDir("up-wedged-unseen");
  LocalClusterOptions options;
  options.workers = 1;
  options.bin_dir = WrappedDaemons(dir, kWedgesOnceKilled, kRealDaemon);
  options.checkpoint_dir = dir + "/checkpoints";
  options.metrics = false;
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::ostringstream out;
  std::ostringstream err;
  UpSupervisor supervisor(**cluster, nullptr, out, err);
  const pid_t shell = (*cluster)->worker(0).pid();
  pid_t worker = -1;
  std::istringstream(ReadAll(absl::StrCat("/proc/", shell, "/task/", shell, "/children"))) >>
      worker;
  ASSERT_GT(worker, 0);  // kill(-1) would reach every process
  ASSERT_EQ(kill(worker, SIGKILL), 0);
  const std::optional<int> wedged = (*cluster)->worker(0).Wait(absl::Seconds(60));
  ASSERT_TRUE(wedged.has_value());
  ASSERT_TRUE(WIFEXITED(*wedged) && WEXITSTATUS(*wedged) == 3) << *wedged;
  EXPECT_FALSE(supervisor.EveryWorkerGone());
  EXPECT_TRUE(supervisor.OnChildExit());
  EXPECT_THAT(out.str(),
              HasSubstr("worker-0 ended itself wedged (exit status 3); started it again"))
      << err.str();
  EXPECT_NE((*cluster)->worker(0).pid(), shell);
  EXPECT_FALSE((*cluster)->worker(0).Wait(absl::ZeroDuration()).has_value()) << "it runs";
}

// A coordinator that fails before `up --job`'s job is READY is started
// again too, and the job created before is taken back. Here worker-1's
// wrapper says it listens, then waits on a FIFO before it starts the real
// daemon, so the job waits for it (PENDING) until the test opens the gate.
// (Before, `up` gave up: "job 'mlp-demo' is not READY: ... UNAVAILABLE".)
TEST(UpSupervisorTest, ACoordinatorThatFailsBeforeTheJobIsReadyIsStartedAgain) {
  const std::string dir = testing::MakeTempDir("up-coordinator-fails-early");
  const Gate gate(dir);
  const std::string address_file = dir + "/address";
  std::unique_ptr<ChildProcess> up = StartUpWithWorker1Held(dir, gate, address_file);
  ASSERT_NE(up, nullptr);
  ASSERT_NO_FATAL_FAILURE(SignalTheCoordinator(*up, SIGKILL));
  const std::string restarted = ReadUntil(*up, "coordinator: back on");
  EXPECT_THAT(restarted, HasSubstr("the coordinator failed (killed by signal 9, Killed); starting "
                                   "it again on "));
  ASSERT_THAT(restarted, HasSubstr("coordinator: back on")) << restarted;
  gate.Open();  // worker-1 starts, and registers with the new coordinator
  const std::string ready = ReadUntil(*up, "The cluster is up");
  EXPECT_THAT(ready, HasSubstr("job 'mlp-demo' is READY at step 0"));
  ASSERT_THAT(ready, HasSubstr("The cluster is up")) << ready;
  ASSERT_TRUE(ClientOf(address_file).Train("mlp-demo", 1, 0, [](const v1::StepResult&) {}).ok());
  up->Signal(SIGINT);
  const std::string stopped = ReadUntil(*up, "stopped cleanly");
  EXPECT_THAT(stopped, HasSubstr("saving job 'mlp-demo' (step 1"));
  EXPECT_THAT(stopped, HasSubstr("stopped cleanly")) << stopped;
  EXPECT_EQ(ExitStatus(*up), 0);
}

// Every worker gone for good while `up --job` waits for the job to be
// READY: it never will be, and `up` stops at once, failed, rather than at
// its 120 s wait. Here worker-1's wrapper says it listens and exits (a
// worker that ended for good), and the test kills worker-0.
TEST(UpSupervisorTest, EveryWorkerGoneBeforeTheJobIsReadyStopsTheCluster) {
  const std::string dir = testing::MakeTempDir("up-workers-gone-early");
  const std::string bin = WrappedDaemons(
      dir,
      absl::StrCat("case \" $* \" in *\" worker-1 \"*)\n"
                   "  echo 'flatshard-worker worker-1 rank 1 listening on 127.0.0.1:1, metrics on "
                   "127.0.0.1:1'\n"
                   "  exit 1 ;;\nesac\n",
                   kRealDaemon),
      kRealDaemon);
  std::vector<std::string> flags = UpFlags(dir, dir + "/address");
  flags.insert(flags.end(), {"--bin-dir", bin});
  std::unique_ptr<ChildProcess> up = StartUp(flags, true);
  ASSERT_NE(up, nullptr);
  ASSERT_THAT(ReadUntil(*up, "waiting for it to be READY"),
              HasSubstr("job 'mlp-demo' created; waiting for it to be READY"));
  const pid_t worker0 = WorkerPid(*up, "worker-0");
  ASSERT_GT(worker0, 0);
  ASSERT_EQ(kill(worker0, SIGKILL), 0);
  const std::string stopped = ReadUntil(*up, "not saved");
  EXPECT_THAT(stopped, HasSubstr("every worker has exited and none is to be started again: "
                                 "stopping the cluster"));
  EXPECT_THAT(stopped, Not(HasSubstr("is not READY")));
  EXPECT_EQ(ExitStatus(*up), 1);
}

// One stopped on purpose then (SIGTERM: exit 0) ends the cluster, said as
// such, rather than reading as the job's failure: its watch ends (UNAVAILABLE,
// "shutting down") before the coordinator has exited.
TEST(UpSupervisorTest, ACoordinatorStoppedBeforeTheJobIsReadyEndsTheCluster) {
  const std::string dir = testing::MakeTempDir("up-coordinator-stopped-early");
  const Gate gate(dir);  // never opened
  std::unique_ptr<ChildProcess> up = StartUpWithWorker1Held(dir, gate, dir + "/address");
  ASSERT_NE(up, nullptr);
  ASSERT_NO_FATAL_FAILURE(SignalTheCoordinator(*up, SIGTERM));
  const std::string stopped = ReadUntil(*up, "stopped (");
  EXPECT_THAT(stopped, HasSubstr("up: the coordinator exited (exit status 0: stopped on purpose); "
                                 "stopping the cluster"));
  EXPECT_THAT(stopped, HasSubstr("the coordinator is gone: stopping the cluster"));
  EXPECT_THAT(stopped, Not(HasSubstr("is not READY")));
  EXPECT_EQ(ExitStatus(*up), 1);
}

// A Ctrl-C while `up` waits for a restarted daemon to start ends that wait
// (before, it waited out the 60 s start timeout): here worker-0 ends itself
// wedged, and its second start holds on a FIFO nobody opens. The
// half-started worker is stopped, and the cluster stops as on any Ctrl-C.
TEST(UpSupervisorTest, ACtrlCWhileAWorkerRestartsEndsTheWait) {
  const std::string dir = testing::MakeTempDir("up-restart-interrupted");
  const Gate gate(dir);  // never opened
  const std::string once = dir + "/started-once";
  const std::string bin = WrappedDaemons(
      dir,
      absl::StrCat("if [ -e ", once,
                   " ]; then\n"
                   "  echo 'worker-0 started again: holding its start' >&2\n"
                   "  read go < ",
                   gate.path(), "\n  exit 1\nfi\ntouch ", once, "\n", kWedgesOnceKilled),
      kRealDaemon);
  std::unique_ptr<ChildProcess> up =
      StartUp({"--workers", "1", "--checkpoint-dir", dir + "/checkpoints", "--bin-dir", bin}, true);
  ASSERT_NE(up, nullptr);
  ASSERT_THAT(ReadUntil(*up, "The cluster is up"), HasSubstr("The cluster is up"));
  ASSERT_NO_FATAL_FAILURE(KillTheWrappedWorker(*up));
  ASSERT_THAT(ReadUntil(*up, "holding its start"), HasSubstr("holding its start"));
  const absl::Time interrupted = absl::Now();
  up->Signal(SIGINT);
  const std::string stopped = ReadUntil(*up, "stopped (");
  EXPECT_THAT(stopped, HasSubstr("up: worker-0 ended itself wedged (exit status 3); starting it "
                                 "again: interrupted while waiting for flatshard-worker (pid "));
  EXPECT_THAT(stopped, HasSubstr(") to start (it stays down)"));
  EXPECT_THAT(stopped, HasSubstr("Interrupt: saving before stopping"));
  // The one Ctrl-C, not taken for a second one.
  EXPECT_THAT(stopped, Not(HasSubstr("Interrupt again")));
  EXPECT_THAT(stopped, HasSubstr("stopped (")) << stopped;
  EXPECT_LT(absl::Now() - interrupted, absl::Seconds(30));
  // The half-started worker was killed: not every daemon exited cleanly.
  EXPECT_EQ(ExitStatus(*up), 1);
}

// A Ctrl-C while the cluster first starts (here its worker never says it
// listens, and ignores SIGTERM) stops what started at once, rather than
// after the 60 s start timeout and the worker's 10 s grace, and says so.
TEST(UpSupervisorTest, ACtrlCWhileTheClusterStartsStopsIt) {
  const std::string dir = testing::MakeTempDir("up-start-interrupted");
  const Gate gate(dir);  // never opened
  const std::string bin = WrappedDaemons(
      dir,
      absl::StrCat("trap '' TERM\necho 'worker-0: holding its start' >&2\nread go < ", gate.path(),
                   "\nexit 1"),
      kRealDaemon);
  std::unique_ptr<ChildProcess> up =
      StartUp({"--workers", "1", "--checkpoint-dir", dir + "/checkpoints", "--bin-dir", bin}, true);
  ASSERT_NE(up, nullptr);
  ASSERT_THAT(ReadUntil(*up, "holding its start"), HasSubstr("holding its start"));
  const absl::Time interrupted = absl::Now();
  up->Signal(SIGINT);
  const std::string stopped = ReadUntil(*up, "while the cluster started");
  EXPECT_THAT(stopped, HasSubstr("Interrupt while the cluster started (interrupted while waiting "
                                 "for flatshard-worker (pid "));
  EXPECT_THAT(stopped, HasSubstr(") to start): stopped"));
  EXPECT_EQ(ExitStatus(*up), 1);
  EXPECT_LT(absl::Now() - interrupted, absl::Seconds(8));
}

// And while Prometheus (`--prometheus`) starts: here a stand-in that never
// answers /-/ready. It is killed, and the cluster stops as on any Ctrl-C.
TEST(UpSupervisorTest, ACtrlCWhilePrometheusStartsStopsTheCluster) {
  const std::string dir = testing::MakeTempDir("up-prometheus-interrupted");
  const Gate gate(dir);  // never opened
  const std::string prometheus = dir + "/prometheus";
  std::ofstream(prometheus) << "#!/bin/sh\necho 'prometheus: holding its start' >&2\nread go < "
                            << gate.path() << "\n";
  ASSERT_EQ(chmod(prometheus.c_str(), 0755), 0) << strerror(errno);
  std::unique_ptr<ChildProcess> up =
      StartUp({"--workers", "1", "--checkpoint-dir", dir + "/checkpoints", "--prometheus",
               "--prometheus-listen", "127.0.0.1:0", "--prometheus-binary", prometheus,
               "--prometheus-config-dir", std::string(FLATSHARD_SOURCE_DIR) + "/deploy/prometheus"},
              true);
  ASSERT_NE(up, nullptr);
  ASSERT_THAT(ReadUntil(*up, "holding its start"), HasSubstr("holding its start"));
  const absl::Time interrupted = absl::Now();
  up->Signal(SIGINT);
  const std::string stopped = ReadUntil(*up, "stopped cleanly");
  EXPECT_THAT(stopped, HasSubstr("Interrupt while Prometheus started: stopping the cluster"));
  EXPECT_THAT(stopped, HasSubstr("stopped cleanly")) << stopped;
  EXPECT_EQ(ExitStatus(*up), 0);
  EXPECT_LT(absl::Now() - interrupted, absl::Seconds(30));
}
// A worker restart that fails (here worker-0's second start exits before it
// says it listens) is tried again after 1 s, and the next try brings it
// back: counted, registered, and the cluster runs on. (Before, the worker
// stayed down for good.)
TEST(UpSupervisorTest, AFailedWorkerRestartIsTriedAgain) {
  const std::string dir = testing::MakeTempDir("up-restart-retried");
  const std::string once = dir + "/started-once";
  const std::string twice = dir + "/started-twice";
  const std::string bin =
      WrappedDaemons(dir,
                     absl::StrCat("if [ -e ", twice, " ]; then\n  ", kRealDaemon, "\nfi\nif [ -e ",
                                  once, " ]; then\n  touch ", twice, "\n  exit 1\nfi\ntouch ", once,
                                  "\n", kWedgesOnceKilled),
                     kRealDaemon);
  const std::string address_file = dir + "/address";
  std::unique_ptr<ChildProcess> up =
      StartUp({"--workers", "1", "--checkpoint-dir", dir + "/checkpoints", "--bin-dir", bin,
               "--address-file", address_file},
              true);
  ASSERT_NE(up, nullptr);
  ASSERT_THAT(ReadUntil(*up, "The cluster is up"), HasSubstr("The cluster is up"));
  ASSERT_NO_FATAL_FAILURE(KillTheWrappedWorker(*up));
  const std::string said = ReadUntil(*up, "started it again");
  EXPECT_THAT(said, HasSubstr("up: worker-0 ended itself wedged (exit status 3); starting it again "
                              "failed (restart 1 of the 3 allowed within 10m): flatshard-worker "
                              "(pid "));
  EXPECT_THAT(said, HasSubstr(") exited before it was ready; trying again in 1s"));
  ASSERT_THAT(said, HasSubstr("worker-0 (another try); started it again (restart 2 of the 3 "
                              "allowed within 10m)"))
      << said;
  // Back, under its id: the coordinator lists it.
  auto workers = ClientOf(address_file).ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 1u);
  EXPECT_EQ((*workers)[0].worker_id(), "worker-0");
  EXPECT_GT(WorkerPid(*up, "worker-0"), 0);
  up->Signal(SIGINT);
  EXPECT_THAT(ReadUntil(*up, "stopped cleanly"), HasSubstr("stopped cleanly"));
  EXPECT_EQ(ExitStatus(*up), 0);
}

// A worker that cannot start again at all is tried again after 1 s, then
// 2 s, and left down when its third try (its restart limit) fails, said
// once.
TEST(UpSupervisorTest, AWorkerThatCannotStartAgainStaysDownPastItsLimit) {
  const std::string dir = testing::MakeTempDir("up-restart-fails");
  const std::string once = dir + "/started-once";
  const std::string bin = WrappedDaemons(
      dir,
      absl::StrCat("if [ -e ", once, " ]; then exit 1; fi\ntouch ", once, "\n", kWedgesOnceKilled),
      kRealDaemon);
  std::unique_ptr<ChildProcess> up =
      StartUp({"--workers", "1", "--checkpoint-dir", dir + "/checkpoints", "--bin-dir", bin}, true);
  ASSERT_NE(up, nullptr);
  ASSERT_THAT(ReadUntil(*up, "The cluster is up"), HasSubstr("The cluster is up"));
  ASSERT_NO_FATAL_FAILURE(KillTheWrappedWorker(*up));
  const std::string said = ReadUntil(*up, "stays down");
  EXPECT_THAT(said, HasSubstr("starting it again failed (restart 1 of the 3 allowed within 10m)"));
  EXPECT_THAT(said, HasSubstr("trying again in 1s"));
  EXPECT_THAT(said, HasSubstr("up: worker-0 (another try); starting it again failed (restart 2 of "
                              "the 3 allowed within 10m)"));
  EXPECT_THAT(said, HasSubstr("trying again in 2s"));
  EXPECT_THAT(said, HasSubstr("up: worker-0 (another try); starting it again failed (restart 3 of "
                              "the 3 allowed within 10m)"));
  EXPECT_THAT(said, HasSubstr(") exited before it was ready; it stays down"));
  EXPECT_THAT(said, Not(HasSubstr("trying again in 4s")));
  EXPECT_THAT(said, Not(HasSubstr("started it again (")));
  EXPECT_EQ(WorkerPid(*up, "worker-0"), -1) << "not started again";
  // Its only worker down for good: the cluster can do nothing more, and up
  // stops, failed, by itself.
  const std::string stopped = ReadUntil(*up, "not saved");
  EXPECT_THAT(stopped, HasSubstr("every worker has exited and none is to be started again: "
                                 "stopping the cluster"));
  EXPECT_THAT(stopped, Not(HasSubstr("another try")));
  EXPECT_EQ(ExitStatus(*up), 1);
}

}  // namespace
}  // namespace flatshard
