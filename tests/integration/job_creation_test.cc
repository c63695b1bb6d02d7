// Creating a job while the rest of the coordinator goes on: CreateJob lists
// the job's checkpoint directory (where its history starts) and writes its
// record outside the coordinator's lock, which every heartbeat and job call
// takes. The test holds a creation inside that listing, with the job's
// checkpoint clock (asked for first there), and calls into the coordinator
// meanwhile: a real coordinator over a real checkpoint directory.
#include <future>
#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

#include "coordinator/coordinator.h"
#include "storage/spec_files.h"
#include "tests/integration/gate.h"
#include "tests/integration/multiprocess.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;

constexpr auto kPatience = std::chrono::seconds(60);

class JobCreationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions options;
    options.job.checkpoint_root = testing::MakeTempDir("job-creation") + "/checkpoints";
    options.job.checkpoint_clock = [this] {
      clock_.Pass();
      return absl::Now();
    };
    coordinator_ = std::make_unique<Coordinator>(options);
  }
  static v1::JobSpec Spec(const std::string& name) {
    auto spec = LoadJobSpecFile(std::string(FLATSHARD_SOURCE_DIR) + "/examples/mlp-job.yaml");
    if (!spec.ok()) {
      ADD_FAILURE() << spec.status();
      return v1::JobSpec();
    }
    spec->set_name(name);
    spec->set_world_size(2);
    return *spec;
  }
  // A creation of `name` held inside its checkpoint listing. Each test lets
  // it go in a cleanup declared after its futures, whatever it asserted:
  // their destructors wait for the calls the gate holds.
  std::future<absl::StatusOr<v1::Job>> HeldCreate(const std::string& name) {
    clock_.Arm();
    auto created = std::async(std::launch::async,
                              [this, spec = Spec(name)] { return coordinator_->CreateJob(spec); });
    EXPECT_TRUE(clock_.WaitEntered(kPatience)) << "the creation never asked the checkpoint clock";
    return created;
  }
  // `call` on another thread; false when it does not return while the
  // creation is held (the gate is then let go, so that it does).
  template <typename Call>
  bool ReturnsMeanwhile(Call call) {
    auto done = std::async(std::launch::async, call);
    if (done.wait_for(kPatience) == std::future_status::ready) return true;
    clock_.Release();
    return false;
  }

  testing::Gate clock_;  // in the checkpoint clock's way
  std::unique_ptr<Coordinator> coordinator_;
};

TEST_F(JobCreationTest, ACreationUnderWayHoldsNoOtherCall) {
  auto created = HeldCreate("a");
  absl::Cleanup let_go = [this] { clock_.Release(); };
  EXPECT_TRUE(ReturnsMeanwhile([this] { EXPECT_EQ(coordinator_->current_job(), nullptr); }));
  EXPECT_TRUE(ReturnsMeanwhile([this] { EXPECT_EQ(coordinator_->JobRank("worker-0"), -1); }));
  EXPECT_TRUE(ReturnsMeanwhile([this] {
    EXPECT_EQ(coordinator_->FindJob("a").status().code(), absl::StatusCode::kNotFound);
  }));
  // Another create is turned away until this one is done.
  EXPECT_TRUE(ReturnsMeanwhile([this] {
    const absl::Status other = coordinator_->CreateJob(Spec("b")).status();
    EXPECT_EQ(other.code(), absl::StatusCode::kUnavailable) << other;
    EXPECT_THAT(other.message(), HasSubstr("job 'a' is being created"));
  }));
  clock_.Release();
  ASSERT_TRUE(created.get().ok());
  absl::StatusOr<std::shared_ptr<TrainingJob>> a = coordinator_->FindJob("a");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_NE((*a)->states().state(), v1::STOPPED);
}

// The stopped job a creation replaces stays until the new one is in place,
// and no delete of it comes between.
TEST_F(JobCreationTest, TheJobACreationReplacesCannotBeDeletedMeanwhile) {
  ASSERT_TRUE(coordinator_->CreateJob(Spec("a")).ok());
  std::shared_ptr<TrainingJob> a = coordinator_->current_job();
  a->Stop("the test stops it");
  auto created = HeldCreate("b");
  absl::Cleanup let_go = [this] { clock_.Release(); };
  EXPECT_TRUE(ReturnsMeanwhile([this, a] {
    EXPECT_EQ(coordinator_->current_job(), a);
    const absl::Status deleted = coordinator_->DeleteJob("a");
    EXPECT_EQ(deleted.code(), absl::StatusCode::kUnavailable) << deleted;
    EXPECT_THAT(deleted.message(), HasSubstr("job 'b' is being created"));
  }));
  clock_.Release();
  ASSERT_TRUE(created.get().ok());
  EXPECT_EQ(coordinator_->current_job()->name(), "b");
}

// A shutdown that comes while a creation is under way lets it finish and
// stops the job it made: none is left running behind the shutdown.
TEST_F(JobCreationTest, AShutdownStopsTheJobACreationUnderWayMakes) {
  auto created = HeldCreate("a");
  auto shutdown =
      std::async(std::launch::async, [this] { coordinator_->Shutdown("the test shuts it down"); });
  absl::Cleanup let_go = [this] { clock_.Release(); };
  // The shutdown has begun once it turns creates away.
  const v1::JobSpec probe_spec = Spec("probe");
  EXPECT_TRUE(ReturnsMeanwhile([this, &probe_spec] {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    absl::Status probe;
    do {
      probe = coordinator_->CreateJob(probe_spec).status();
    } while (!absl::StrContains(probe.message(), "shutting down") && absl::Now() < deadline);
    EXPECT_THAT(probe.message(), HasSubstr("the coordinator is shutting down"));
  }));
  clock_.Release();
  ASSERT_TRUE(created.get().ok());
  ASSERT_EQ(shutdown.wait_for(kPatience), std::future_status::ready);
  ASSERT_NE(coordinator_->current_job(), nullptr);
  EXPECT_EQ(coordinator_->current_job()->states().state(), v1::STOPPED);
}

}  // namespace
}  // namespace flatshard
