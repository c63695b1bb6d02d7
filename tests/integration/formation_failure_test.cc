// Formations and recoveries that fail under a worker, with real coordinator
// and worker processes (docs/fault-tolerance.md, "When a formation fails"):
// the spare that broke a re-formation is passed over on the next try, the
// survivor that was waiting in the failed epoch's rendezvous is released at
// once (the coordinator abandons that epoch's keys) instead of at its 120 s
// collective timeout, a worker that stops while being configured fails the
// formation at its heartbeat timeout instead of the configure timeout, and one
// that stops during the recovery's restore fails that try at the heartbeat
// timeout instead of the batch timeout. Each test bounds how long it took well
// below the timeout it would otherwise wait out. A worker that cannot be
// configured to grow back onto, or cannot load the checkpoint it grows from,
// costs one restart, not one per checkpoint; and a spare that cannot read the
// checkpoints is passed over by the recovery's next try; a spare no rank can
// connect to is forgiven one try, without spending a restart, then passed over.
#include <cerrno>
#include <csignal>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"

#include "client/flatshard_client.h"
#include "client/local_cluster.h"
#include "coordinator/grpc_worker_client.h"
#include "storage/spec_files.h"
#include "tests/integration/multiprocess.h"
#include "tests/integration/recovery_harness.h"
#include "tests/integration/regression_data_set.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// The survivor's rendezvous would hold it this long without the abandonment,
// and a formation would wait this long for a stopped worker without the
// heartbeat verdict; recoveries here must take far less than either.
constexpr double kCollectiveTimeoutS = 120;
constexpr double kConfigureTimeoutS = 40;
constexpr double kBatchTimeoutS = 60;
constexpr double kHeartbeatTimeoutS = 4;
constexpr double kRecoveryBoundS = 25;

std::unique_ptr<LocalCluster> StartCluster(
    int workers, const std::string& checkpoint_dir, const std::string& data_dir,
    std::map<int, std::vector<std::string>> command_prefix = {},
    std::map<int, std::string> worker_checkpoint_dirs = {},
    std::map<int, std::vector<std::string>> worker_flags = {}) {
  LocalClusterOptions options;
  options.workers = workers;
  options.bin_dir = FLATSHARD_BIN_DIR;
  options.heartbeat_interval_s = 0.25;
  options.heartbeat_timeout_s = kHeartbeatTimeoutS;
  options.collective_timeout_s = kCollectiveTimeoutS;
  options.checkpoint_dir = checkpoint_dir;
  options.data_dir = data_dir;
  options.coordinator_flags = {"--configure-timeout", std::to_string(kConfigureTimeoutS),
                               "--batch-timeout", std::to_string(kBatchTimeoutS)};
  options.worker_command_prefix = std::move(command_prefix);
  options.worker_checkpoint_dirs = std::move(worker_checkpoint_dirs);
  options.worker_flags = std::move(worker_flags);
  auto cluster = LocalCluster::Start(options);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  return cluster.ok() ? *std::move(cluster) : nullptr;
}

// The demo MLP at world size 2, recovering up to 3 times, with spares; with
// `data_set`, trained on the .npy files there (under each worker's data dir).
v1::JobSpec Job(const std::string& data_set = "") {
  auto spec = LoadJobSpecFile(std::string(FLATSHARD_SOURCE_DIR) + "/examples/mlp-job.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (!data_set.empty()) {
    spec->mutable_data()->set_kind(v1::DataSpec::FILE);
    spec->mutable_data()->set_path(data_set);
  }
  spec->set_world_size(2);
  spec->mutable_recovery()->set_max_restarts(3);
  spec->mutable_recovery()->set_spare_wait_s(10);
  return *spec;
}

// The job's ranks by worker id (workers outside the epoch are left out).
std::map<std::string, int> RanksByWorker(FlatshardClient& client, const std::string& job) {
  std::map<std::string, int> ranks;
  auto workers = client.ListWorkers(job);
  EXPECT_TRUE(workers.ok()) << workers.status();
  if (!workers.ok()) return ranks;
  for (const v1::WorkerInfo& w : *workers) {
    if (w.rank() >= 0) ranks[w.worker_id()] = w.rank();
  }
  return ranks;
}

// Checkpoint storage the nodes share: <dir>/checkpoints, which node i mounts
// at <dir>/n<i>-checkpoints (a symlink to it; its worker's --checkpoint-dir).
// A node that lost its mount has an empty mount point instead.
class SharedCheckpointStorage {
 public:
  SharedCheckpointStorage(const std::string& dir, int nodes, const std::set<int>& unmounted = {})
      : dir_(dir), shared_(dir + "/checkpoints") {
    std::filesystem::create_directories(shared_);
    for (int i = 0; i < nodes; ++i) {
      mounts_[i] = MountPoint(i);
      if (unmounted.contains(i)) {
        std::filesystem::create_directory(MountPoint(i));
      } else {
        std::filesystem::create_directory_symlink(shared_, MountPoint(i));
      }
    }
  }
  void Unmount(int i) {
    std::filesystem::remove_all(MountPoint(i));  // the symlink, not the storage
    std::filesystem::create_directory(MountPoint(i));
  }
  void Mount(int i) {
    std::filesystem::remove_all(MountPoint(i));
    std::filesystem::create_directory_symlink(shared_, MountPoint(i));
  }
  std::unique_ptr<LocalCluster> StartCluster(int workers) const {
    return ::flatshard::StartCluster(workers, shared_, ".", {}, mounts_);
  }

 private:
  std::string MountPoint(int i) const { return absl::StrCat(dir_, "/n", i, "-checkpoints"); }

  std::string dir_;
  std::string shared_;
  std::map<int, std::string> mounts_;
};

TEST(FormationFailureTest, ASpareWithoutTheDataIsPassedOverAndTheSurvivorIsReleasedAtOnce) {
  const std::string dir = testing::MakeTempDir("formation-data");
  // Two kinds of node: every worker reads its data set under "data", relative
  // to where it runs; worker 2 runs where there is none (its mount is missing).
  testing::WriteRegressionDataSet(dir + "/with/data");
  std::filesystem::create_directories(dir + "/without");
  std::map<int, std::vector<std::string>> where;
  for (int i = 0; i < 4; ++i) {
    where[i] = {"/usr/bin/env", "-C", dir + (i == 2 ? "/without" : "/with")};
  }
  // Ranks 0 and 1 on workers 0 and 1; workers 2 and 3 are spares, 2 first.
  std::unique_ptr<LocalCluster> cluster = StartCluster(4, dir + "/checkpoints", "data", where);
  ASSERT_NE(cluster, nullptr);
  FlatshardClient client(cluster->address());
  const v1::JobSpec spec = Job(/*data_set=*/"set");
  testing::CreateAndWaitReady(client, spec);

  testing::TrainRun run = testing::TrainAndKill(*cluster, client, spec.name(), 6,
                                                /*kill_after=*/2, {1});
  ASSERT_TRUE(run.status.ok()) << run.status;
  auto job = client.GetJob(spec.name());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->step(), 6);
  EXPECT_EQ(job->world_size(), 2);
  // The first try seated worker 2, whose Configure failed; the second seated
  // worker 3 beside the survivor, which was free for it at once.
  EXPECT_EQ(job->restarts(), 2);
  const v1::Recovery& r = job->last_recovery();
  EXPECT_TRUE(r.spare_used());
  EXPECT_THAT(r.cause(), HasSubstr("(worker worker-2 at "));
  EXPECT_THAT(r.cause(), HasSubstr("could not be configured"));
  EXPECT_LT(r.seconds(), kRecoveryBoundS) << r.ShortDebugString();
  const std::map<std::string, int> rank_of = RanksByWorker(client, spec.name());
  EXPECT_EQ(rank_of, (std::map<std::string, int>{{"worker-0", 0}, {"worker-3", 1}}));
}

bool CanListenOnIpv6Loopback() {
  const int fd = ::socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in6 address{};
  address.sin6_family = AF_INET6;
  address.sin6_addr = in6addr_loopback;
  const bool bound = ::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0;
  ::close(fd);
  return bound;
}

int Occurrences(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A spare that no rank can connect to, and that can connect to none: its
// Gloo pairs are IPv6 (--advertise-host ::1), the ranks' IPv4, and a pair
// between them fails at once on both ends, each naming the other
// (UnreachablePeer, across the Configure call). A failed link is blamed on
// neither end the first time (a port the kernel handed to another listener
// fails a try that way once): the next try seats the same spare without
// spending a restart, and its second failed link passes it over; the third
// try shrinks. With recovery.max_restarts 2 the job trains on: had the
// forgiven try spent a restart, the second would have failed the job.
TEST(FormationFailureTest, ASpareNoRankCanConnectToIsForgivenOnceThenPassedOver) {
  if (!CanListenOnIpv6Loopback()) GTEST_SKIP() << "no IPv6 loopback (::1) on this machine";
  const std::string dir = testing::MakeTempDir("formation-link");
  // Ranks 0 and 1 on workers 0 and 1; worker 2, the spare, on IPv6.
  std::unique_ptr<LocalCluster> cluster =
      StartCluster(3, dir + "/checkpoints", ".", {}, {},
                   {{2, {"--listen", "[::1]:0", "--advertise-host", "::1"}}});
  ASSERT_NE(cluster, nullptr);
  FlatshardClient client(cluster->address());
  v1::JobSpec spec = Job();
  spec.mutable_recovery()->set_max_restarts(2);
  spec.mutable_recovery()->set_spare_wait_s(0.5);
  testing::CreateAndWaitReady(client, spec);

  testing::TrainRun run = testing::TrainAndKill(*cluster, client, spec.name(), 6,
                                                /*kill_after=*/2, {1});
  ASSERT_TRUE(run.status.ok()) << run.status;
  auto job = client.GetJob(spec.name());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->step(), 6);
  EXPECT_EQ(job->world_size(), 1);
  EXPECT_EQ(job->restarts(), 2);  // the forgiven try not among them
  const v1::Recovery& r = job->last_recovery();
  EXPECT_FALSE(r.spare_used());
  // The last try's cause carries the two tries before it: each failed on
  // the link between the spare and rank 0, named by whichever end failed first.
  EXPECT_EQ(Occurrences(r.cause(), "could not be configured (its peer rank "), 2) << r.cause();
  EXPECT_EQ(Occurrences(r.cause(), "did not connect)"), 2) << r.cause();
  EXPECT_EQ(Occurrences(r.cause(), "(a failed link, forgiven once: not counted)"), 1) << r.cause();
  EXPECT_THAT(r.cause(), HasSubstr("worker-2 at [::1]:"));
  EXPECT_EQ(RanksByWorker(client, spec.name()), (std::map<std::string, int>{{"worker-0", 0}}));
}

TEST(FormationFailureTest, AWorkerThatStopsWhileBeingConfiguredFailsItAtTheHeartbeatTimeout) {
  const std::string dir = testing::MakeTempDir("formation-stopped");
  // Worker 1's data set is a pair of FIFOs nobody writes: its Configure hangs
  // opening them, as on a hung network mount, while it still heartbeats.
  testing::WriteRegressionDataSet(dir + "/good/data");
  std::filesystem::create_directories(dir + "/hung/data/set");
  for (const char* file : {"/inputs.npy", "/targets.npy"}) {
    ASSERT_EQ(mkfifo((dir + "/hung/data/set" + file).c_str(), 0600), 0) << std::strerror(errno);
  }
  std::map<int, std::vector<std::string>> where = {{0, {"/usr/bin/env", "-C", dir + "/good"}},
                                                   {1, {"/usr/bin/env", "-C", dir + "/hung"}}};
  std::unique_ptr<LocalCluster> cluster = StartCluster(2, dir + "/checkpoints", "data", where);
  ASSERT_NE(cluster, nullptr);
  FlatshardClient client(cluster->address());
  const v1::JobSpec spec = Job(/*data_set=*/"set");
  ASSERT_TRUE(client.CreateJob(spec).ok());

  // Both ranks are in Configure: rank 0 waits in the rendezvous for rank 1.
  GrpcWorkerClient rank0(cluster->worker_addresses()[0], nullptr, cluster->command_token());
  GrpcWorkerClient rank1(cluster->worker_addresses()[1], nullptr, cluster->command_token());
  const auto state_of = [](GrpcWorkerClient& worker) {
    auto status = worker.GetStatus(absl::Now() + absl::Seconds(1));
    return status.ok() ? status->state() : std::string(status.status().message());
  };
  const absl::Time created = absl::Now();
  const auto both_configuring = [&] {
    return state_of(rank1) == "configuring" && state_of(rank0) == "configuring";
  };
  while (!both_configuring() && absl::Now() - created < absl::Seconds(30)) {
  }
  ASSERT_EQ(state_of(rank1), "configuring");
  ASSERT_EQ(state_of(rank0), "configuring");
  // Now it stops altogether: only its missing heartbeats tell.
  const absl::Time stopped = absl::Now();
  cluster->worker(1).Signal(SIGSTOP);
  auto failed = client.WaitForState(spec.name(), {v1::FAILED}, absl::Seconds(kRecoveryBoundS));
  ASSERT_TRUE(failed.ok()) << failed.status() << " (the formation waits its configure timeout)";
  EXPECT_LT(absl::Now() - stopped, absl::Seconds(kRecoveryBoundS));
  auto job = client.GetJob(spec.name());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_THAT(job->failure(),
              HasSubstr("rank 1 (worker worker-1) could not be configured: worker worker-1 at "));
  EXPECT_THAT(job->failure(), HasSubstr("missed heartbeats"));

  // Rank 0 was released from the abandoned rendezvous: a job on it alone
  // forms now, not after its 120 s collective timeout.
  ASSERT_TRUE(client.DeleteJob(spec.name()).ok());
  v1::JobSpec solo = Job();
  solo.set_name("solo");
  solo.set_world_size(1);
  (*solo.mutable_rank_by_worker_id())["worker-0"] = 0;
  ASSERT_TRUE(client.CreateJob(solo).ok());
  auto ready = client.WaitForState(solo.name(), {v1::READY}, absl::Seconds(kRecoveryBoundS));
  EXPECT_TRUE(ready.ok()) << ready.status();
  cluster->worker(1).Signal(SIGKILL);  // a stopped worker would hold up the teardown
}

// Mirrors every file under `from` into `to` as a FIFO nobody writes: a
// worker that reads them there hangs, as on a hung network mount.
void MirrorAsFifos(const std::string& from, const std::string& to) {
  for (const auto& entry : std::filesystem::recursive_directory_iterator(from)) {
    const std::filesystem::path target = to / std::filesystem::relative(entry.path(), from);
    if (entry.is_directory()) {
      std::filesystem::create_directories(target);
    } else {
      std::filesystem::create_directories(target.parent_path());
      ASSERT_EQ(mkfifo(target.c_str(), 0600), 0) << target << ": " << std::strerror(errno);
    }
  }
}

// A recovery whose spare's restore hangs: the coordinator and workers 0, 1
// and 3 share "ckpt" under dir/shared (the test runs there); worker 2 runs in
// dir/stalled, whose copy of the checkpoint hangs on every read. The job
// saved "base" at step 2; rank 1 dies while the job is idle, and the
// recovery seats worker 2, whose restore hangs reading the checkpoint.
struct HangingRestore {
  ~HangingRestore() {
    cluster.reset();  // stopped where it ran
    std::filesystem::current_path(cwd);
  }
  std::filesystem::path cwd = std::filesystem::current_path();
  std::unique_ptr<LocalCluster> cluster;
  v1::JobSpec spec;
};

// Returns once worker 2 runs the restore.
void StartARestoreThatHangsOnWorker2(const std::string& dir, HangingRestore& h) {
  std::filesystem::create_directories(dir + "/shared");
  std::filesystem::create_directories(dir + "/stalled");
  std::filesystem::current_path(dir + "/shared");
  h.cluster = StartCluster(4, "ckpt", ".", {{2, {"/usr/bin/env", "-C", dir + "/stalled"}}});
  ASSERT_NE(h.cluster, nullptr);
  FlatshardClient client(h.cluster->address());
  h.spec = Job();
  h.spec.mutable_state_dict_settings()->set_state_dict_type(v1::SHARDED_STATE_DICT);
  testing::CreateAndWaitReady(client, h.spec);
  ASSERT_TRUE(client.Train(h.spec.name(), 2, 0, [](const v1::StepResult&) {}).ok());
  v1::SaveCheckpointRequest save;
  save.set_job(h.spec.name());
  save.set_name("base");
  ASSERT_TRUE(client.SaveCheckpoint(save).ok());
  MirrorAsFifos(dir + "/shared/ckpt", dir + "/stalled/ckpt");
  h.cluster->worker(1).Signal(SIGKILL);
  GrpcWorkerClient spare(h.cluster->worker_addresses()[2], nullptr, h.cluster->command_token());
  const absl::Time killed = absl::Now();
  std::string state;
  while (state != "running" && absl::Now() - killed < absl::Seconds(60)) {
    auto status = spare.GetStatus(absl::Now() + absl::Seconds(1));
    state = status.ok() ? status->state() : "";
  }
  ASSERT_EQ(state, "running") << "the recovery never ran a batch on worker 2";
}

// Then worker 2 stops altogether.
TEST(FormationFailureTest, AWorkerThatStopsDuringTheRestoreFailsThatTryAtTheHeartbeatTimeout) {
  HangingRestore h;
  ASSERT_NO_FATAL_FAILURE(
      StartARestoreThatHangsOnWorker2(testing::MakeTempDir("restore-stopped"), h));
  LocalCluster* cluster = h.cluster.get();
  const v1::JobSpec& spec = h.spec;
  FlatshardClient client(cluster->address());
  const absl::Time stopped = absl::Now();
  cluster->worker(2).Signal(SIGSTOP);
  // READY again after a RECOVERING that came after the kill.
  bool recovered = false;
  ASSERT_TRUE(client
                  .WatchEvents(spec.name(),
                               [&](const v1::JobEvent& event) {
                                 if (event.state() == v1::FAILED) return false;
                                 if (event.state() == v1::RECOVERING) recovered = true;
                                 return !(recovered && event.state() == v1::READY);
                               })
                  .ok());
  const absl::Duration took = absl::Now() - stopped;
  cluster->worker(2).Signal(SIGKILL);  // a stopped worker would hold up the teardown
  EXPECT_LT(took, absl::Seconds(kRecoveryBoundS)) << "the restore waited its batch timeout";
  auto job = client.GetJob(spec.name());
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state(), v1::READY) << job->failure();
  EXPECT_EQ(job->restarts(), 2);
  EXPECT_EQ(job->step(), 2);  // from "base"
  const v1::Recovery& r = job->last_recovery();
  EXPECT_THAT(r.cause(), HasSubstr("rank 1: worker worker-2 at "));
  EXPECT_THAT(r.cause(), HasSubstr("missed heartbeats"));
  EXPECT_EQ(r.checkpoint(), "base");
  const std::map<std::string, int> rank_of = RanksByWorker(client, spec.name());
  EXPECT_EQ(rank_of, (std::map<std::string, int>{{"worker-0", 0}, {"worker-3", 1}}));
  ASSERT_TRUE(client.Train(spec.name(), 1, 0, [](const v1::StepResult&) {}).ok());
}

// Then worker 2 is shut down (SIGTERM: its node drained, say): its server
// cancels the batch as it stops. That is the rank's failure, not a stop of
// the job: the try fails, worker 2 is passed over, and the recovery tries
// again with the next spare at once.
TEST(FormationFailureTest, AWorkerShutDownDuringTheRestoreFailsOnlyThatTry) {
  HangingRestore h;
  ASSERT_NO_FATAL_FAILURE(
      StartARestoreThatHangsOnWorker2(testing::MakeTempDir("restore-shut-down"), h));
  FlatshardClient client(h.cluster->address());
  // Meanwhile, the job FORMING its new epoch, an operation is refused as
  // transient (the same call succeeds once READY), not as a job still
  // waiting for workers to be started.
  auto forming = client.GetJob(h.spec.name());
  ASSERT_TRUE(forming.ok()) << forming.status();
  EXPECT_EQ(forming->state(), v1::FORMING);
  v1::SaveCheckpointRequest meanwhile;
  meanwhile.set_job(h.spec.name());
  meanwhile.set_name("meanwhile");
  const absl::Status refused = client.SaveCheckpoint(meanwhile).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("FORMING a new epoch"));
  h.cluster->worker(2).Signal(SIGTERM);
  auto ready = client.WaitForState(h.spec.name(), {v1::READY}, absl::Seconds(kRecoveryBoundS),
                                   {v1::RECOVERING});
  h.cluster->worker(2).Signal(SIGKILL);  // its read may still hang: not in the teardown's way
  ASSERT_TRUE(ready.ok()) << ready.status();
  auto job = client.GetJob(h.spec.name());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->restarts(), 2);
  EXPECT_EQ(job->step(), 2);  // from "base"
  const v1::Recovery& r = job->last_recovery();
  EXPECT_THAT(r.cause(), HasSubstr("rank 1 ("));
  EXPECT_EQ(r.checkpoint(), "base");
  const std::map<std::string, int> rank_of = RanksByWorker(client, h.spec.name());
  EXPECT_EQ(rank_of, (std::map<std::string, int>{{"worker-0", 0}, {"worker-3", 1}}));
  ASSERT_TRUE(client.Train(h.spec.name(), 1, 0, [](const v1::StepResult&) {}).ok());
}

// Growing back (docs/fault-tolerance.md): a worker whose node lost its data
// set rejoins under its old id and cannot be configured. The job tries to
// grow back onto it once, recovers from that (one restart), and passes it
// over at the checkpoints after; before, every checkpoint spent a restart on
// it and the fourth failed the job. Once it registers again (the node fixed,
// the daemon restarted) the job grows back onto it.
// Rank 1 dies at step 3 and, with no spare, the job shrinks to world size 1.
// While its daemon is down its node breaks (`break_node(worker index)`); the
// daemon comes back under its old id and cannot join when the job grows back
// at a checkpoint (`why` names the failure): one restart over five
// checkpoints, not one per checkpoint. Once `fix_node` has fixed the node and
// the daemon registers again, the job grows back onto it.
void ExpectGrowingToPassOverABrokenNode(LocalCluster& cluster, v1::JobSpec spec,
                                        const std::function<void(int)>& break_node,
                                        const std::function<void(int)>& fix_node,
                                        const std::string& why) {
  FlatshardClient client(cluster.address());
  spec.mutable_checkpoints()->set_every_steps(2);
  spec.mutable_checkpoints()->set_keep_last(0);
  spec.mutable_state_dict_settings()->set_state_dict_type(v1::SHARDED_STATE_DICT);
  spec.mutable_recovery()->set_max_restarts(4);
  spec.mutable_recovery()->set_spare_wait_s(0.5);
  testing::CreateAndWaitReady(client, spec);
  const auto job_now = [&] {
    auto job = client.GetJob(spec.name());
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job{};
  };

  const int victim = testing::WorkerIndexOfRank(cluster, client, spec.name(), 1);
  ASSERT_GE(victim, 0);
  testing::TrainRun run = testing::TrainAndKill(cluster, client, spec.name(), 4,
                                                /*kill_after=*/3, {1});
  ASSERT_TRUE(run.status.ok()) << run.status;
  ASSERT_EQ(job_now().world_size(), 1);
  const int restarts = job_now().restarts();

  break_node(victim);
  ASSERT_TRUE(cluster.worker(victim).Wait(absl::Seconds(30)).has_value());
  ASSERT_TRUE(cluster.RestartWorker(victim).ok());
  // Checkpoints at steps 6, 8, 10, 12 and 14: one try to grow onto it.
  absl::Status trained = client.Train(spec.name(), 10, 0, [](const v1::StepResult&) {});
  ASSERT_TRUE(trained.ok()) << trained << " (a restart spent at every checkpoint)";
  v1::Job job = job_now();
  EXPECT_EQ(job.step(), 14);
  EXPECT_EQ(job.world_size(), 1);
  EXPECT_EQ(job.restarts(), restarts + 1);
  EXPECT_THAT(job.last_recovery().cause(), HasSubstr("growing back failed"));
  EXPECT_THAT(job.last_recovery().cause(), HasSubstr(why));

  // The node is fixed and the daemon restarted: a new registration, tried
  // again at the next checkpoint (step 16), which it joins.
  fix_node(victim);
  cluster.worker(victim).Signal(SIGKILL);
  ASSERT_TRUE(cluster.worker(victim).Wait(absl::Seconds(30)).has_value());
  // Started again at once: its old registration is still live, and the new
  // daemon takes it over with the id's secret from its state dir.
  const absl::Status restarted = cluster.RestartWorker(victim);
  ASSERT_TRUE(restarted.ok()) << restarted;
  std::map<int64_t, int> ranks_by_step;
  trained = client.Train(spec.name(), 4, 0, [&](const v1::StepResult& r) {
    ranks_by_step[r.step()] = r.rank_losses_size();
  });
  ASSERT_TRUE(trained.ok()) << trained;
  job = job_now();
  EXPECT_EQ(job.step(), 18);
  EXPECT_EQ(job.world_size(), 2);
  EXPECT_EQ(ranks_by_step[18], 2);
}

TEST(FormationFailureTest, AWorkerThatCannotJoinIsPassedOverForGrowingUntilItRegistersAgain) {
  const std::string dir = testing::MakeTempDir("grow-refused");
  const auto node = [&](int i) { return absl::StrCat(dir, "/n", i); };
  testing::WriteRegressionDataSet(node(0) + "/data");
  testing::WriteRegressionDataSet(node(1) + "/data");
  std::unique_ptr<LocalCluster> cluster =
      StartCluster(2, dir + "/checkpoints", "data",
                   {{0, {"/usr/bin/env", "-C", node(0)}}, {1, {"/usr/bin/env", "-C", node(1)}}});
  ASSERT_NE(cluster, nullptr);
  // Its node lost the data set: it cannot be configured.
  ExpectGrowingToPassOverABrokenNode(
      *cluster, Job(/*data_set=*/"set"),
      [&](int victim) { std::filesystem::remove_all(node(victim) + "/data"); },
      [&](int victim) { testing::WriteRegressionDataSet(node(victim) + "/data"); },
      "could not be configured");
}

TEST(FormationFailureTest, AWorkerThatCannotLoadTheCheckpointIsPassedOverForGrowingToo) {
  SharedCheckpointStorage storage(testing::MakeTempDir("grow-unloadable"), 2);
  std::unique_ptr<LocalCluster> cluster = storage.StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  // Its node lost the mount (an empty mount point): it is configured, but
  // cannot read the checkpoint the job grows back from.
  ExpectGrowingToPassOverABrokenNode(
      *cluster, Job(), [&](int victim) { storage.Unmount(victim); },
      [&](int victim) { storage.Mount(victim); }, "it has no manifest.json");
}

TEST(FormationFailureTest, ASpareThatCannotReadTheCheckpointsIsPassedOverByTheNextTry) {
  // Worker 2's node has an empty mount point instead of the storage.
  const SharedCheckpointStorage storage(testing::MakeTempDir("spare-unloadable"), 4, {2});
  // Ranks 0 and 1 on workers 0 and 1; workers 2 and 3 are spares, 2 first.
  std::unique_ptr<LocalCluster> cluster = storage.StartCluster(4);
  ASSERT_NE(cluster, nullptr);
  FlatshardClient client(cluster->address());
  v1::JobSpec spec = Job();
  spec.mutable_state_dict_settings()->set_state_dict_type(v1::SHARDED_STATE_DICT);
  spec.mutable_checkpoints()->set_every_steps(2);
  testing::CreateAndWaitReady(client, spec);
  ASSERT_EQ(RanksByWorker(client, spec.name()),
            (std::map<std::string, int>{{"worker-0", 0}, {"worker-1", 1}}));

  // Rank 1 dies at step 3: the first try takes spare 2, which cannot read the
  // step-2 checkpoint; the next passes it over for spare 3.
  testing::TrainRun run = testing::TrainAndKill(*cluster, client, spec.name(), 4,
                                                /*kill_after=*/3, {1});
  ASSERT_TRUE(run.status.ok()) << run.status << " (every try took the spare that cannot load)";
  auto job = client.GetJob(spec.name());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::IDLE);  // trained, not failed
  EXPECT_EQ(job->step(), 4);
  EXPECT_EQ(job->world_size(), 2);
  // Two tries: spare 2, then spare 3 (one, should spare 2 have missed its
  // heartbeats on a loaded machine and not been live for the first).
  EXPECT_LE(job->restarts(), 2);
  EXPECT_TRUE(job->last_recovery().spare_used());
  EXPECT_EQ(RanksByWorker(client, spec.name()),
            (std::map<std::string, int>{{"worker-0", 0}, {"worker-3", 1}}));
}

TEST(FormationFailureTest, ASpareThatCannotReadTheCheckpointsIsNotGrownOntoEither) {
  // Worker 2, the only spare, has an empty mount point.
  const SharedCheckpointStorage storage(testing::MakeTempDir("spare-not-grown"), 3, {2});
  std::unique_ptr<LocalCluster> cluster = storage.StartCluster(3);
  ASSERT_NE(cluster, nullptr);
  FlatshardClient client(cluster->address());
  v1::JobSpec spec = Job();
  spec.mutable_state_dict_settings()->set_state_dict_type(v1::SHARDED_STATE_DICT);
  spec.mutable_checkpoints()->set_every_steps(2);
  spec.mutable_checkpoints()->set_keep_last(0);
  spec.mutable_recovery()->set_max_restarts(4);
  spec.mutable_recovery()->set_spare_wait_s(0.5);
  testing::CreateAndWaitReady(client, spec);

  // Rank 1 dies at step 3: the spare fails the restore, the next try shrinks.
  testing::TrainRun run = testing::TrainAndKill(*cluster, client, spec.name(), 4,
                                                /*kill_after=*/3, {1});
  ASSERT_TRUE(run.status.ok()) << run.status;
  auto job = client.GetJob(spec.name());
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->world_size(), 1);
  // A try with the spare, a try without (one, had the spare not been live
  // yet); then the checkpoint at step 4 must not grow back onto it.
  EXPECT_LE(job->restarts(), 2);
  EXPECT_THAT(job->last_recovery().cause(), Not(HasSubstr("growing back")));
  const int restarts = job->restarts();
  // Checkpoints at steps 6 to 14: the job does not try to grow onto it.
  const absl::Status trained = client.Train(spec.name(), 10, 0, [](const v1::StepResult&) {});
  ASSERT_TRUE(trained.ok()) << trained;
  job = client.GetJob(spec.name());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->step(), 14);
  EXPECT_EQ(job->world_size(), 1);
  EXPECT_EQ(job->restarts(), restarts) << job->last_recovery().cause();
  EXPECT_THAT(job->last_recovery().cause(), Not(HasSubstr("growing back")));
}

}  // namespace
}  // namespace flatshard
