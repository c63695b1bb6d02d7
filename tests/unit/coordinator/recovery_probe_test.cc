// Tests which clients a recovery's probe asks (coordinator/training_job_probe.cc),
// with in-process workers: a member the first try's probe lost is given up
// (its client disconnected, so its channel stops redialing the address) and
// a new client takes its place, through which the next try of the same
// recovery asks it again. Real daemons and channels:
// tests/integration/gone_worker_channel_test.cc.
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "coordinator/kv_store.h"
#include "coordinator/training_job.h"
#include "core/job_config.h"
#include "storage/spec_files.h"
#include "tests/unit/coordinator/unused_worker_client.h"

namespace flatshard {
namespace {

using ::testing::ElementsAre;

// What the workers did, by worker id and client generation (the n-th client
// made for that worker).
struct WorkerLog {
  std::mutex mu;
  std::map<std::string, int> clients_made;                // guarded by mu
  std::map<std::pair<std::string, int>, int> probes;      // answered OK; guarded by mu
  std::vector<std::pair<std::string, int>> disconnected;  // guarded by mu
};

// Configure answers at once (OK, or FAILED_PRECONDITION for a worker that
// cannot join); GetStatus answers OK, except through `lost`'s first client,
// which answers as a probe that ran out of time does.
class ScriptedWorker : public testing::UnusedWorkerClient {
 public:
  ScriptedWorker(std::string id, std::string address, int generation, WorkerLog* log,
                 bool cannot_join, bool probe_lost)
      : id_(std::move(id)),
        address_(std::move(address)),
        generation_(generation),
        log_(log),
        cannot_join_(cannot_join),
        probe_lost_(probe_lost) {}

  void ConfigureAsync(v1::ConfigureRequest, absl::Time, absl::Time, ConfigureDone done) override {
    done(cannot_join_ ? absl::FailedPreconditionError("no data set on this node")
                      : absl::OkStatus());
  }
  void GetStatusAsync(absl::Time, GetStatusDone done) override {
    if (probe_lost_) {
      done(absl::DeadlineExceededError("the probe ran out of time"));
      return;
    }
    {
      std::lock_guard<std::mutex> lock(log_->mu);
      ++log_->probes[{id_, generation_}];
    }
    done(v1::GetStatusResponse());
  }
  void Disconnect() override {
    std::lock_guard<std::mutex> lock(log_->mu);
    log_->disconnected.emplace_back(id_, generation_);
  }
  void AbortAsync(uint64_t, const std::string&, absl::Time, AbortDone done) override {
    done(absl::OkStatus());
  }
  std::string address() const override { return address_; }

 private:
  std::string id_;
  std::string address_;
  int generation_;
  WorkerLog* log_;
  bool cannot_join_;
  bool probe_lost_;
};

WorkerRecord Worker(const std::string& id) {
  WorkerRecord w;
  w.worker_id = id;
  w.address = id + ":1";
  w.device = "cpu";
  return w;
}

// W=2 on "w-a" and "w-b", and a spare "w-s" that cannot join. Rank 1 fails;
// the recovery's first probe loses "w-b" (through the client the job formed
// with) and seats the spare, whose Configure fails: that try fails and the
// spare is refused. The next try asks "w-b" again through the client that
// took the lost one's place; it answers, and the job re-forms on "w-a" and
// "w-b" at its world size. Through the first client, given up and
// disconnected, it could not have answered: with no spare left, the job
// would have shrunk.
TEST(RecoveryProbeTest, AMemberLostToTheFirstTrysProbeIsAskedAgainThroughANewClient) {
  auto spec = LoadJobSpecFile(std::string(FLATSHARD_SOURCE_DIR) + "/examples/mlp-job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  spec->set_world_size(2);
  spec->mutable_recovery()->set_spare_wait_s(0);
  auto config = JobConfigFromProto(*spec);
  ASSERT_TRUE(config.ok()) << config.status();
  KvStore store;
  WorkerLog log;
  TrainingJobOptions options;
  options.rendezvous = &store;
  options.checkpoint_root = ::testing::TempDir() + "/recovery-probe-test-checkpoints";
  options.live_workers = [] { return std::vector<WorkerRecord>{Worker("w-a"), Worker("w-s")}; };
  options.connect = [&log](const WorkerRecord& w, size_t) -> std::unique_ptr<WorkerClient> {
    int generation = 0;
    {
      std::lock_guard<std::mutex> lock(log.mu);
      generation = log.clients_made[w.worker_id]++;
    }
    return std::make_unique<ScriptedWorker>(w.worker_id, w.address, generation, &log,
                                            /*cannot_join=*/w.worker_id == "w-s",
                                            /*probe_lost=*/w.worker_id == "w-b" && generation == 0);
  };
  auto created = TrainingJob::Create(*spec, *std::move(config), std::move(options));
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<TrainingJob> job = *std::move(created);
  ASSERT_TRUE(job->Form({Worker("w-a"), Worker("w-b")}).ok());

  const size_t formed_events = job->states().EventsFrom(0, absl::Now()).size();
  ASSERT_TRUE(job->FailRank(1, "w-b", absl::UnavailableError("w-b missed its heartbeats")));
  // Until the recovery has ended, READY or FAILED.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  size_t next = formed_events;
  v1::JobState state = job->states().state();
  while (absl::Now() < deadline) {
    const std::vector<JobEventRecord> events = job->states().EventsFrom(next, deadline);
    next += events.size();
    state = job->states().state();
    if (!events.empty() && (state == v1::READY || state == v1::FAILED)) break;
  }
  ASSERT_EQ(state, v1::READY) << job->states().failure();
  EXPECT_EQ(job->world_size(), 2);
  EXPECT_THAT(job->worker_ids(), ElementsAre("w-a", "w-b"));
  EXPECT_EQ(job->restarts(), 2);  // the spare's try, then this one
  ASSERT_TRUE(job->last_recovery().has_value());
  EXPECT_FALSE(job->last_recovery()->spare_used());
  std::lock_guard<std::mutex> lock(log.mu);
  // The first client of "w-b" was let go once its probe failed ...
  EXPECT_THAT(log.disconnected, ::testing::Contains(std::make_pair(std::string("w-b"), 0)));
  // ... and the second try's probe reached it through the next one.
  EXPECT_EQ((log.probes[{"w-b", 1}]), 1);
}

}  // namespace
}  // namespace flatshard
