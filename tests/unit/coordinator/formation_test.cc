// Tests TrainingJob's formation logic (coordinator/training_job_formation.cc) with
// in-process workers whose Configure is held until cancelled: which failure
// ends a formation, when the heartbeat monitor may end it, and that the
// epoch's rendezvous is abandoned. The behaviour with real processes is
// tests/integration/formation_failure_test.cc.
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "coordinator/kv_store.h"
#include "coordinator/training_job.h"
#include "core/job_config.h"
#include "core/status_payloads.h"
#include "storage/spec_files.h"
#include "tests/unit/coordinator/unused_worker_client.h"

namespace flatshard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Configure answers `answer` at once, or (unset) is held until CancelAll,
// as at a rendezvous that a rank never reaches.
class ConfigureOnlyWorker : public testing::UnusedWorkerClient {
 public:
  ConfigureOnlyWorker(std::string address, std::optional<absl::Status> answer, int* entered,
                      std::mutex* mu, std::condition_variable* cv)
      : address_(std::move(address)),
        answer_(std::move(answer)),
        entered_(entered),
        mu_(mu),
        cv_(cv) {}

  void ConfigureAsync(v1::ConfigureRequest, absl::Time, absl::Time, ConfigureDone done) override {
    {
      std::lock_guard<std::mutex> lock(*mu_);
      ++*entered_;
      cv_->notify_all();
      if (!answer_.has_value() && !cancelled_) {
        held_ = std::move(done);
        return;
      }
    }
    // Outside the lock: a failure's formation cancels every worker's calls.
    done(answer_.has_value() ? *answer_ : absl::CancelledError("cancelled by the coordinator"));
  }
  void CancelAll() override {
    ConfigureDone held;
    {
      std::lock_guard<std::mutex> lock(*mu_);
      cancelled_ = true;
      held = std::exchange(held_, nullptr);
    }
    if (held) held(absl::CancelledError("cancelled by the coordinator"));
  }
  void AbortAsync(uint64_t, const std::string&, absl::Time, AbortDone done) override {
    done(absl::OkStatus());
  }
  std::string address() const override { return address_; }

 private:
  std::string address_;
  std::optional<absl::Status> answer_;
  int* entered_;
  std::mutex* mu_;
  std::condition_variable* cv_;
  bool cancelled_ = false;  // guarded by *mu_
  ConfigureDone held_;      // guarded by *mu_
};

class FormationTest : public ::testing::Test {
 protected:
  // A W=2 job whose worker "w-b" answers Configure with `b_answer` (unset:
  // blocks like "w-a" until cancelled).
  std::unique_ptr<TrainingJob> MakeJob(const std::optional<absl::Status>& b_answer) {
    auto spec = LoadJobSpecFile(std::string(FLATSHARD_SOURCE_DIR) + "/examples/mlp-job.yaml");
    EXPECT_TRUE(spec.ok()) << spec.status();
    spec->set_world_size(2);
    auto config = JobConfigFromProto(*spec);
    EXPECT_TRUE(config.ok()) << config.status();
    TrainingJobOptions options;
    options.rendezvous = &store_;
    options.checkpoint_root = ::testing::TempDir() + "/formation-test-checkpoints";
    options.mark_unreachable = [this](const WorkerRecord& w) {
      std::lock_guard<std::mutex> lock(mu_);
      marked_unreachable_.push_back(w.worker_id);
    };
    options.connect = [this, b_answer](const WorkerRecord& w,
                                       size_t world_size) -> std::unique_ptr<WorkerClient> {
      {
        std::lock_guard<std::mutex> lock(mu_);
        connected_.emplace_back(w.worker_id, world_size);
      }
      return std::make_unique<ConfigureOnlyWorker>(
          w.address, w.worker_id == "w-b" ? b_answer : std::nullopt, &entered_, &mu_, &cv_);
    };
    auto job = TrainingJob::Create(*spec, *std::move(config), std::move(options));
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *std::move(job) : nullptr;
  }

  static std::vector<WorkerRecord> Members() {
    std::vector<WorkerRecord> members(2);
    members[0].worker_id = "w-a";
    members[0].address = "a:1";
    members[0].device = "cpu";
    members[1].worker_id = "w-b";
    members[1].address = "b:1";
    members[1].device = "cpu";
    return members;
  }

  void WaitUntilBothConfiguring() {
    std::unique_lock<std::mutex> lock(mu_);
    ASSERT_TRUE(cv_.wait_for(lock, std::chrono::seconds(30), [&] { return entered_ == 2; }));
  }

  KvStore store_;
  std::mutex mu_;
  std::condition_variable cv_;
  int entered_ = 0;
  std::vector<std::string> marked_unreachable_;  // guarded by mu_
  // Each client made: its worker and the world size it was made for.
  std::vector<std::pair<std::string, size_t>> connected_;  // guarded by mu_
};

TEST_F(FormationTest, AMemberSilentForATimeoutWithinTheFormationEndsIt) {
  std::unique_ptr<TrainingJob> job = MakeJob(std::nullopt);
  ASSERT_NE(job, nullptr);
  absl::Status formed;
  std::thread former([&] { formed = job->Form(Members()); });
  WaitUntilBothConfiguring();
  const absl::Status gone = absl::UnavailableError("worker w-b missed heartbeats");
  const absl::Duration timeout = absl::Seconds(1);
  const absl::Time now = absl::Now();
  // Not a member of the formation.
  EXPECT_FALSE(job->FailFormingWorker("w-x", absl::InfinitePast(), timeout, now, gone));
  // Silent since before the formation began (an earlier try marked it
  // unreachable), but not yet for a whole timeout within it.
  EXPECT_FALSE(job->FailFormingWorker("w-b", absl::InfinitePast(), timeout, now, gone));
  EXPECT_TRUE(
      job->FailFormingWorker("w-b", absl::InfinitePast(), timeout, now + absl::Seconds(2), gone));
  EXPECT_FALSE(job->FailFormingWorker("w-a", absl::InfinitePast(), timeout, now + absl::Seconds(2),
                                      gone));  // the first cause stands
  former.join();
  EXPECT_EQ(formed.code(), absl::StatusCode::kUnavailable) << formed;
  EXPECT_THAT(
      std::string(formed.message()),
      HasSubstr("rank 1 (worker w-b) could not be configured: worker w-b missed heartbeats"));
  EXPECT_EQ(job->states().state(), v1::FAILED);
  // Its rendezvous is abandoned: a rank still waiting there is released.
  const absl::Status wait = store_.Wait({"job/mlp-demo/epoch/1/rank0"}, absl::Hours(1));
  EXPECT_EQ(wait.code(), absl::StatusCode::kAborted) << wait;
  EXPECT_FALSE(job->FailFormingWorker("w-b", absl::InfinitePast(), timeout, now + absl::Seconds(2),
                                      gone));  // nothing forming now
}

TEST_F(FormationTest, ACallTheWorkerCancelledFailsTheFormationNamingThatRank) {
  // Its server shutting down cancels the call: that is this rank's failure,
  // not the coordinator's own cancellation (which would leave the job FORMING).
  std::unique_ptr<TrainingJob> job = MakeJob(absl::CancelledError("server shutting down"));
  ASSERT_NE(job, nullptr);
  const absl::Status formed = job->Form(Members());
  EXPECT_EQ(formed.code(), absl::StatusCode::kUnavailable) << formed;
  EXPECT_THAT(std::string(formed.message()),
              HasSubstr("rank 1 (worker w-b at b:1) could not be configured: server shutting "
                        "down"));
  EXPECT_EQ(job->states().state(), v1::FAILED);
  std::lock_guard<std::mutex> lock(mu_);
  EXPECT_THAT(marked_unreachable_, ElementsAre("w-b"));  // its call failed: maybe gone
  // Each rank's client knows the world it fans out over (WorkerChannelIdle).
  EXPECT_THAT(connected_, ElementsAre(std::pair<std::string, size_t>("w-a", 2),
                                      std::pair<std::string, size_t>("w-b", 2)));
}

// A rank that could not connect to a peer answered its call: it is not marked
// unreachable, and the failure keeps the peer (UnreachablePeer) for the
// recovery's LinkFailures, and names its worker.
TEST_F(FormationTest, ARankThatCouldNotReachAPeerNamesItAndIsNotMarkedUnreachable) {
  std::unique_ptr<TrainingJob> job = MakeJob(WithUnreachablePeer(
      absl::UnavailableError("gloo rendezvous failed: connect: Connection refused"), 0));
  ASSERT_NE(job, nullptr);
  const absl::Status formed = job->Form(Members());
  EXPECT_EQ(formed.code(), absl::StatusCode::kUnavailable) << formed;
  EXPECT_THAT(std::string(formed.message()),
              HasSubstr("rank 1 (worker w-b at b:1) could not be configured (its peer rank 0 is "
                        "worker w-a at a:1): gloo rendezvous failed: connect: Connection refused"));
  EXPECT_EQ(UnreachablePeer(formed), std::optional<int>(0));
  std::lock_guard<std::mutex> lock(mu_);
  EXPECT_THAT(marked_unreachable_, IsEmpty());
}

}  // namespace
}  // namespace flatshard
