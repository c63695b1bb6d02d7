// Bad requests against a real coordinator over gRPC (issue #4): each gets a
// precise status code and a message naming the field or state, nothing
// changes, and the daemon keeps serving good requests afterwards.
#include "coordinator/service/job_service.h"

#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>

#include "client/flatshard_client.h"
#include "coordinator/coordinator.h"
#include "core/job_spec_yaml.h"
#include "flatshard/v1/membership.grpc.pb.h"
#include "proto/grpc_status.h"
#include "storage/spec_files.h"
#include "tests/integration/in_process_coordinator.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;

class JobServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto coordinator = testing::InProcessCoordinator::Start(CoordinatorOptions{});
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
    client_ = std::make_unique<FlatshardClient>(coordinator_->address());
    membership_stub_ = v1::Membership::NewStub(
        grpc::CreateChannel(coordinator_->address(), grpc::InsecureChannelCredentials()));
    auto spec = LoadJobSpecFile(std::string(FLATSHARD_SOURCE_DIR) + "/examples/mlp-job.yaml");
    ASSERT_TRUE(spec.ok()) << spec.status();
    spec_ = *spec;
  }

  // Expects `status` to carry `code` and a message containing `text`.
  static void ExpectRefused(const absl::Status& status, absl::StatusCode code,
                            const std::string& text) {
    EXPECT_EQ(status.code(), code) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(text));
  }

  absl::Status Create(const v1::JobSpec& spec) { return client_->CreateJob(spec).status(); }

  absl::Status Register(const v1::RegisterRequest& request) {
    grpc::ClientContext context;
    v1::RegisterResponse response;
    return FromGrpcStatus(membership_stub_->Register(&context, request, &response));
  }

  std::unique_ptr<testing::InProcessCoordinator> coordinator_;
  std::unique_ptr<FlatshardClient> client_;
  std::unique_ptr<v1::Membership::Stub> membership_stub_;
  v1::JobSpec spec_;
};

TEST_F(JobServiceTest, BadRequestsGetPreciseErrorsAndChangeNothing) {
  using absl::StatusCode;
  int kinds = 0;
  auto bad = [&](auto mutate, StatusCode code, const std::string& text) {
    v1::JobSpec spec = spec_;
    mutate(spec);
    ExpectRefused(Create(spec), code, text);
    ++kinds;
  };
  // Job specs (validated field by field by core/job_config on the wire form).
  bad(
      [](v1::JobSpec& s) {
        s.mutable_sharding()->set_strategy(static_cast<v1::ShardingStrategy>(42));
      },
      StatusCode::kInvalidArgument, "sharding.strategy");
  bad(
      [](v1::JobSpec& s) {
        s.mutable_sharding()->set_strategy(v1::HYBRID_SHARD);
        s.mutable_sharding()->set_hybrid_shard_group_size(3);
      },
      StatusCode::kInvalidArgument, "hybrid_shard_group_size");
  bad([](v1::JobSpec& s) { s.clear_model(); }, StatusCode::kInvalidArgument, "model");
  bad(
      [](v1::JobSpec& s) {
        auto* root = s.mutable_model()->mutable_root();
        *root->add_children() = root->children(0);
      },
      StatusCode::kInvalidArgument, "duplicate");
  bad([](v1::JobSpec& s) { s.mutable_optimizer()->set_lr(-0.1); }, StatusCode::kInvalidArgument,
      "optimizer.lr");
  bad([](v1::JobSpec& s) { s.set_world_size(0); }, StatusCode::kInvalidArgument, "world_size");
  bad([](v1::JobSpec& s) { s.set_name(""); }, StatusCode::kInvalidArgument, "name");
  bad([](v1::JobSpec& s) { s.mutable_data()->set_global_batch_size(30); },
      StatusCode::kInvalidArgument, "global_batch_size");
  EXPECT_EQ(client_->GetJob(spec_.name()).status().code(), StatusCode::kNotFound)
      << "no bad spec created anything";

  // The job, then requests that do not fit its state.
  ASSERT_TRUE(Create(spec_).ok());
  ExpectRefused(Create(spec_), StatusCode::kAlreadyExists, "already exists");
  ++kinds;
  v1::JobSpec other = spec_;
  other.set_name("other");
  ExpectRefused(Create(other), StatusCode::kFailedPrecondition, "one job at a time");
  ++kinds;
  const std::string job = spec_.name();
  ExpectRefused(client_->Train(job, 5, 0, [](const v1::StepResult&) {}),
                StatusCode::kFailedPrecondition, "PENDING");
  ++kinds;
  ExpectRefused(client_->Train(job, 0, 0, [](const v1::StepResult&) {}),
                StatusCode::kInvalidArgument, "train.steps");
  ++kinds;
  ExpectRefused(client_->Train(job, 1, -1, [](const v1::StepResult&) {}),
                StatusCode::kInvalidArgument, "no_sync_micro_steps");
  ++kinds;
  ExpectRefused(client_->Train("nope", 1, 0, [](const v1::StepResult&) {}), StatusCode::kNotFound,
                "no job named 'nope'");
  ++kinds;
  ExpectRefused(client_->Unshard(job, {7}), StatusCode::kInvalidArgument, "unit 7 does not exist");
  ++kinds;
  ExpectRefused(client_->Reshard(job, {-1}), StatusCode::kInvalidArgument, "unit -1");
  ++kinds;
  ExpectRefused(client_->Unshard(job, {}), StatusCode::kFailedPrecondition, "PENDING");
  ++kinds;
  auto no_op = [](const v1::TensorChunk&) { return absl::OkStatus(); };
  ExpectRefused(client_->SummonFullParams(job, false, -5, no_op), StatusCode::kInvalidArgument,
                "chunk_bytes");
  ++kinds;
  ExpectRefused(client_->SummonFullParams(job, false, int64_t{1} << 40, no_op),
                StatusCode::kInvalidArgument, "chunk_bytes must be between 0 (4 MiB) and 33554432");
  ++kinds;
  ExpectRefused(client_->SummonFullParams(job, true, 0, no_op), StatusCode::kInvalidArgument,
                "use_orig_params");
  ++kinds;
  v1::StateDictSettings sharded;
  sharded.set_state_dict_type(v1::SHARDED_STATE_DICT);
  sharded.mutable_state_dict_config()->set_rank0_only(true);
  ExpectRefused(client_->SetStateDictSettings(job, sharded).status(), StatusCode::kInvalidArgument,
                "rank0_only");
  ++kinds;
  ExpectRefused(client_->DeleteJob("nope"), StatusCode::kNotFound, "nope");
  ++kinds;
  ExpectRefused(client_->GetJob("").status(), StatusCode::kInvalidArgument, "name");
  ++kinds;
  v1::JobSpec bad_plan = spec_;
  bad_plan.set_world_size(-2);
  ExpectRefused(client_->Plan(bad_plan).status(), StatusCode::kInvalidArgument, "world_size");
  ++kinds;
  // A plan too big to compute on the coordinator's time (valid, but 65,536
  // ranks' slices of every parameter).
  v1::JobSpec huge_plan = spec_;
  huge_plan.set_world_size(65536);
  huge_plan.mutable_data()->set_global_batch_size(65536);
  ExpectRefused(client_->Plan(huge_plan).status(), StatusCode::kResourceExhausted,
                "plan_rank_slices");
  ++kinds;

  // Membership.
  v1::RegisterRequest anonymous;
  anonymous.set_address("127.0.0.1:1");
  ExpectRefused(Register(anonymous), StatusCode::kInvalidArgument, "worker_id");
  ++kinds;
  v1::RegisterRequest first;
  first.set_worker_id("w0");
  first.set_address("127.0.0.1:1");
  first.set_requested_rank(0);
  ASSERT_TRUE(Register(first).ok());
  v1::RegisterRequest clash = first;
  clash.set_worker_id("w1");
  ExpectRefused(Register(clash), StatusCode::kAlreadyExists, "rank 0");
  ++kinds;
  EXPECT_GE(kinds, 15);

  // Still serving: health, and the good requests.
  EXPECT_EQ(client_->GetJob(job)->state(), v1::PENDING);
  v1::StateDictSettings full;
  full.set_state_dict_type(v1::FULL_STATE_DICT);
  full.mutable_state_dict_config()->set_rank0_only(true);
  EXPECT_TRUE(client_->SetStateDictSettings(job, full).ok());
  auto plan = client_->Plan(spec_);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(*plan, HasSubstr("\"units\""));
  ASSERT_TRUE(client_->DeleteJob(job).ok());
  EXPECT_TRUE(Create(other).ok()) << "another job once the first is deleted";
}

TEST_F(JobServiceTest, WatchEventsReplaysTheLifecycle) {
  ASSERT_TRUE(Create(spec_).ok());
  std::vector<v1::JobState> seen;
  std::thread deleter;
  absl::Status watched = client_->WatchEvents(spec_.name(), [&](const v1::JobEvent& e) {
    seen.push_back(e.state());
    // Delete once the creation event arrived: the stream must then end.
    if (seen.size() == 1) {
      deleter = std::thread([&] { EXPECT_TRUE(client_->DeleteJob(spec_.name()).ok()); });
    }
    return true;
  });
  deleter.join();
  EXPECT_TRUE(watched.ok()) << watched;
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], v1::PENDING);
  EXPECT_EQ(seen[1], v1::STOPPED);
}

TEST_F(JobServiceTest, OnceTheCoordinatorShutsDownNoJobIsCreatedDeletedOrReadAsStopped) {
  ASSERT_TRUE(Create(spec_).ok());
  // The shutdown stops the job in memory only (its record stays for the next
  // start): a create must not take the stopped job for a deleted one and
  // replace it, nor a delete remove the record the next start needs.
  coordinator_->coordinator().Shutdown("SIGTERM");
  v1::JobSpec other = spec_;
  other.set_name("other");
  ExpectRefused(Create(other), absl::StatusCode::kUnavailable, "shutting down");
  ExpectRefused(client_->DeleteJob(spec_.name()), absl::StatusCode::kUnavailable, "shutting down");
  // Nor is the job read as STOPPED (as deleted): until the server stops, the
  // coordinator is unavailable, as it is after.
  ExpectRefused(client_->GetJob(spec_.name()).status(), absl::StatusCode::kUnavailable,
                "a coordinator started again on it brings the job back");
  ExpectRefused(client_->ListJobs().status(), absl::StatusCode::kUnavailable, "shutting down");
  v1::SaveCheckpointRequest save;
  save.set_job(spec_.name());
  save.set_name("late");
  ExpectRefused(client_->SaveCheckpoint(save).status(), absl::StatusCode::kUnavailable,
                "shutting down");
}

TEST_F(JobServiceTest, AWatchOpenAtShutdownEndsUnavailableWithNoStoppedEvent) {
  ASSERT_TRUE(Create(spec_).ok());
  std::vector<v1::JobState> seen;
  std::thread stopper;
  const absl::Status watched = client_->WatchEvents(spec_.name(), [&](const v1::JobEvent& e) {
    seen.push_back(e.state());
    // Shut down once the watch is open: the job is stopped in memory only,
    // so the watch must not end with the STOPPED a deletion sends.
    if (seen.size() == 1) {
      stopper = std::thread([&] { coordinator_->coordinator().Shutdown("SIGTERM"); });
    }
    return true;
  });
  ASSERT_TRUE(stopper.joinable()) << watched;
  stopper.join();
  ExpectRefused(watched, absl::StatusCode::kUnavailable, "kept in its state dir");
  EXPECT_EQ(seen, std::vector<v1::JobState>{v1::PENDING});
}

}  // namespace
}  // namespace flatshard
