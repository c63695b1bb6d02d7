// A network partition of one worker (issue #11 §7, docs/fault-tolerance.md):
// the worker of rank 2 runs in a network namespace of its own, reached over a
// veth pair; the rest of the cluster (coordinator, 3 ranks and a spare)
// listens on the pair's host end. Mid-training the pair goes down: nothing
// is reset, packets just vanish, as when a switch port or a host's link
// dies. The coordinator sees the heartbeats stop, the job recovers with the
// spare and finishes its steps; when the link heals, the cut-off worker finds
// its epoch gone, drops the batch it was stuck in and serves as a spare.
// And the coordinator cut off from every worker at once: the recovery waits
// for workers, and those that come back when the link heals take their seats
// again. Needs root (network namespaces); skipped with the reason elsewhere.
#include <csignal>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

#include "client/child_process.h"
#include "client/flatshard_client.h"
#include "client/local_cluster.h"
#include "core/job_spec_yaml.h"
#include "storage/spec_files.h"
#include "tests/integration/multiprocess.h"
#include "tests/integration/recovery_harness.h"

namespace flatshard {
namespace {

std::string IpTool() {
  for (const char* path : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (::access(path, X_OK) == 0) return path;
  }
  return "";
}

// Runs `ip args...`; OK when it exits 0.
absl::Status Ip(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {IpTool()};
  argv.insert(argv.end(), args.begin(), args.end());
  absl::StatusOr<std::unique_ptr<ChildProcess>> ip = ChildProcess::Spawn(argv);
  if (!ip.ok()) return ip.status();
  const std::optional<int> status = (*ip)->Wait(absl::Seconds(30));
  if (!status.has_value() || !WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
    return absl::InternalError(absl::StrCat("ip ", absl::StrJoin(args, " "), " failed"));
  }
  return absl::OkStatus();
}

// A namespace with one end of a veth pair; the other end stays here.
class PartitionableNamespace {
 public:
  static absl::StatusOr<std::unique_ptr<PartitionableNamespace>> Create() {
    if (::geteuid() != 0) return absl::PermissionDeniedError("network namespaces need root");
    if (IpTool().empty()) return absl::NotFoundError("no ip(8) (iproute2) on this machine");
    const int id = static_cast<int>(::getpid() % 100000);
    auto ns = std::unique_ptr<PartitionableNamespace>(new PartitionableNamespace(id));
    const std::string& name = ns->name_;
    for (const std::vector<std::string>& step : std::vector<std::vector<std::string>>{
             {"netns", "add", name},
             {"link", "add", ns->host_link_, "type", "veth", "peer", "name", ns->ns_link_},
             {"link", "set", ns->ns_link_, "netns", name},
             {"addr", "add", ns->host_ip_ + "/24", "dev", ns->host_link_},
             {"link", "set", ns->host_link_, "up"},
             {"netns", "exec", name, IpTool(), "addr", "add", ns->ns_ip_ + "/24", "dev",
              ns->ns_link_},
             {"netns", "exec", name, IpTool(), "link", "set", ns->ns_link_, "up"},
             {"netns", "exec", name, IpTool(), "link", "set", "lo", "up"}}) {
      if (absl::Status s = Ip(step); !s.ok()) return s;
    }
    ns->created_ = true;
    return ns;
  }
  ~PartitionableNamespace() {
    if (created_) (void)Ip({"netns", "del", name_});  // takes both veth ends with it
  }

  const std::string& host_ip() const { return host_ip_; }
  const std::string& ns_ip() const { return ns_ip_; }
  std::vector<std::string> exec_prefix() const { return {IpTool(), "netns", "exec", name_}; }
  // The partition: the link goes down; nothing is reset, packets vanish.
  absl::Status Cut() { return Ip({"link", "set", host_link_, "down"}); }
  absl::Status Heal() { return Ip({"link", "set", host_link_, "up"}); }

 private:
  explicit PartitionableNamespace(int id)
      : name_(absl::StrCat("fsp-", id)),
        host_link_(absl::StrCat("fsph", id)),
        ns_link_(absl::StrCat("fspn", id)),
        host_ip_(absl::StrCat("10.201.", id % 250, ".1")),
        ns_ip_(absl::StrCat("10.201.", id % 250, ".2")) {}

  std::string name_, host_link_, ns_link_, host_ip_, ns_ip_;
  bool created_ = false;
};

// A cluster whose coordinator listens on the host end of `ns`'s pair, with
// the heartbeat and coordinator timeouts short (the partition must be found
// by heartbeats, not by a collective's timeout). Served plaintext on purpose:
// these tests are about the partition (test_security covers TLS on such
// addresses). Each test places its workers.
LocalClusterOptions PartitionedCluster(const PartitionableNamespace& ns, const std::string& dir,
                                       int workers) {
  LocalClusterOptions options;
  options.workers = workers;
  options.bin_dir = FLATSHARD_BIN_DIR;
  options.listen = ns.host_ip() + ":0";
  options.heartbeat_interval_s = 0.25;
  options.heartbeat_timeout_s = 2.0;
  options.coordinator_timeout_s = 2.0;
  options.collective_timeout_s = 120;
  options.checkpoint_dir = dir + "/checkpoints";
  options.coordinator_flags = {"--insecure"};
  options.every_worker_flags = {"--insecure"};
  return options;
}

// The example MLP (world size 4) with a SHARDED checkpoint every 3 steps and
// in-memory peer snapshots every step, waiting `spare_wait_s` for workers.
v1::JobSpec RecoveringJob(double spare_wait_s) {
  auto spec = LoadJobSpecFile(std::string(FLATSHARD_SOURCE_DIR) + "/examples/mlp-job.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (!spec.ok()) return v1::JobSpec();
  EXPECT_EQ(spec->world_size(), 4);
  spec->mutable_checkpoints()->set_every_steps(3);
  spec->mutable_checkpoints()->set_in_memory_every_steps(1);
  spec->mutable_state_dict_settings()->set_state_dict_type(v1::SHARDED_STATE_DICT);
  spec->mutable_recovery()->set_spare_wait_s(spare_wait_s);
  return *spec;
}

TEST(PartitionTest, ACutOffWorkerIsReplacedAndServesAsASpareOnceTheLinkHeals) {
  absl::StatusOr<std::unique_ptr<PartitionableNamespace>> ns = PartitionableNamespace::Create();
  if (!ns.ok()) GTEST_SKIP() << "no network namespace: " << ns.status();
  const std::string host = (*ns)->host_ip();

  LocalClusterOptions options =
      PartitionedCluster(**ns, testing::MakeTempDir("partition"), 5);  // ranks 0-3, a spare
  constexpr int kCutOff = 2;
  for (int i = 0; i < options.workers; ++i) {
    const std::string me = i == kCutOff ? (*ns)->ns_ip() : host;
    options.worker_flags[i] = {"--listen", me + ":0", "--advertise-host", me};
  }
  options.worker_command_prefix[kCutOff] = (*ns)->exec_prefix();
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  FlatshardClient client((*cluster)->address());

  const v1::JobSpec spec = RecoveringJob(/*spare_wait_s=*/30);
  testing::CreateAndWaitReady(client, spec);
  auto workers = client.ListWorkers(spec.name());
  ASSERT_TRUE(workers.ok());
  std::string cut_off_id;
  for (const v1::WorkerInfo& w : *workers) {
    if (w.rank() == kCutOff) cut_off_id = w.worker_id();
  }
  ASSERT_EQ(cut_off_id, absl::StrCat("worker-", kCutOff));

  int seen = 0;
  v1::Recovery recovery;
  const absl::Status trained = client.Train(spec.name(), 12, 0, [&](const v1::StepResult& r) {
    if (r.has_recovery()) recovery = r.recovery();
    if (++seen == 4) {
      EXPECT_TRUE((*ns)->Cut().ok());
    }
  });
  ASSERT_TRUE(trained.ok()) << trained;
  auto job = client.GetJob(spec.name());
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->step(), 12);
  EXPECT_EQ(job->world_size(), 4);
  EXPECT_EQ(job->restarts(), 1);
  EXPECT_THAT(recovery.failed_ranks(), ::testing::ElementsAre(kCutOff));
  EXPECT_TRUE(recovery.spare_used());
  EXPECT_LE(recovery.steps_lost(), 1) << recovery.ShortDebugString();
  std::cerr << "partition recovered: " << recovery.ShortDebugString() << "\n";

  // Healed, the cut-off worker heartbeats again and is a spare (no rank),
  // its stale epoch dropped. Polled, bounded.
  ASSERT_TRUE((*ns)->Heal().ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  bool spare = false;
  while (!spare && absl::Now() < deadline) {
    auto all = client.ListWorkers("");  // every worker, -1 for those outside the job
    for (const v1::WorkerInfo& w : all.ok() ? *all : std::vector<v1::WorkerInfo>{}) {
      if (w.worker_id() == cut_off_id && w.rank() < 0 && w.state() != "unreachable" &&
          w.heartbeat_age_seconds() < 1.0) {
        spare = true;
      }
    }
    if (!spare) absl::SleepFor(absl::Milliseconds(100));  // a poll interval
  }
  EXPECT_TRUE(spare) << cut_off_id << " did not come back as a spare within 60 s";
  // And the job still trains.
  EXPECT_TRUE(client.Train(spec.name(), 2, 0, [](const v1::StepResult&) {}).ok());
}

// The coordinator cut off from every worker at once (its link, say): the
// workers, all in the namespace, still reach each other. Every rank misses
// its heartbeats and fails the recovery's probe, and no spare is left. The
// cut outlasts the spare wait (recovery.spare_wait_s): with nobody to re-form
// on, the recovery goes on waiting (recovery.min_world_wait_s). The link
// heals during that wait, and the members that heartbeat again answer a
// probe of their own and take their seats back: the job trains on at its
// world size, where before it failed for want of workers.
TEST(PartitionTest, WorkersCutOffFromTheCoordinatorTakeTheirSeatsBackOnceTheLinkHeals) {
  absl::StatusOr<std::unique_ptr<PartitionableNamespace>> ns = PartitionableNamespace::Create();
  if (!ns.ok()) GTEST_SKIP() << "no network namespace: " << ns.status();
  LocalClusterOptions options =
      PartitionedCluster(**ns, testing::MakeTempDir("partition-all"), 4);  // ranks 0-3
  for (int i = 0; i < options.workers; ++i) {
    options.worker_flags[i] = {"--listen", (*ns)->ns_ip() + ":0", "--advertise-host",
                               (*ns)->ns_ip()};
    options.worker_command_prefix[i] = (*ns)->exec_prefix();
  }
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  FlatshardClient client((*cluster)->address());

  // Also how long the rest have once the first are back: their TCP
  // retransmissions, backed off during the cut, resume seconds apart.
  constexpr double kSpareWaitS = 8;
  v1::JobSpec spec = RecoveringJob(kSpareWaitS);
  spec.mutable_recovery()->set_min_world_wait_s(120);  // bounds the test if the heal never comes
  testing::CreateAndWaitReady(client, spec);

  // Healed only once the spare wait is over and the recovery says it waits
  // for workers to come back (its event; a FAILED job ends the watch too, as
  // does the training's end without that wait).
  const auto heal_once_waiting = [&]() -> absl::Status {
    FlatshardClient watcher((*cluster)->address());
    bool waiting = false;
    const absl::Status watched = watcher.WatchEvents(spec.name(), [&](const v1::JobEvent& e) {
      waiting = e.state() == v1::RECOVERING && absl::StrContains(e.message(), "min_world_wait_s");
      return !waiting && e.state() != v1::FAILED && e.state() != v1::STOPPED &&
             e.state() != v1::IDLE;
    });
    absl::Status healed = (*ns)->Heal();
    if (!waiting) {
      return absl::FailedPreconditionError("the recovery never waited for workers; the watch: " +
                                           watched.ToString());
    }
    return healed;
  };
  std::future<absl::Status> healed;
  int seen = 0;
  v1::Recovery recovery;
  const absl::Status trained = client.Train(spec.name(), 12, 0, [&](const v1::StepResult& r) {
    if (r.has_recovery()) recovery = r.recovery();
    if (++seen == 4) {
      EXPECT_TRUE((*ns)->Cut().ok());
      healed = std::async(std::launch::async, heal_once_waiting);
    }
  });
  ASSERT_TRUE(healed.valid());
  EXPECT_TRUE(healed.get().ok());
  ASSERT_TRUE(trained.ok()) << trained;
  auto job = client.GetJob(spec.name());
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->step(), 12);
  EXPECT_EQ(job->world_size(), 4);
  EXPECT_EQ(job->restarts(), 1);
  EXPECT_THAT(recovery.failed_ranks(), ::testing::ElementsAre(0, 1, 2, 3));
  EXPECT_FALSE(recovery.spare_used());
  EXPECT_EQ(recovery.world_size(), 4);
  EXPECT_GT(recovery.seconds(), kSpareWaitS);
  std::cerr << "every worker back: " << recovery.ShortDebugString() << "\n";
  // Each worker in the seat it had: the same ids, rank for rank.
  auto workers = client.ListWorkers(spec.name());
  ASSERT_TRUE(workers.ok());
  std::map<int, std::string> seated;
  for (const v1::WorkerInfo& w : *workers) seated[w.rank()] = w.worker_id();
  EXPECT_THAT(seated, ::testing::ElementsAre(
                          ::testing::Pair(0, "worker-0"), ::testing::Pair(1, "worker-1"),
                          ::testing::Pair(2, "worker-2"), ::testing::Pair(3, "worker-3")));
}

}  // namespace
}  // namespace flatshard
