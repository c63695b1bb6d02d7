// Bad requests (issue #12 §5): a table of invalid and hostile requests across
// JobService, Membership and WorkerService, sent through raw stubs so they can
// hold what the client would never build. Each is refused with its precise
// code and a message naming the field (or what is wrong), and leaves the
// cluster as it was: the job, its workers, its checkpoints, each worker's own
// status and the rendezvous store. Afterwards the job still trains.
#include "tests/integration/bad_request.h"

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/create_channel.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "rpc/call_metadata.h"

#include "client/flatshard_client.h"
#include "client/local_cluster.h"
#include "coordinator/service/membership_service.h"
#include "core/job_spec_yaml.h"
#include "flatshard/v1/job.grpc.pb.h"
#include "flatshard/v1/membership.grpc.pb.h"
#include "flatshard/v1/worker.grpc.pb.h"
#include "tests/integration/mlp_cluster.h"
#include "tests/integration/multiprocess.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;
using JobStub = v1::JobService::Stub;
using MemberStub = v1::Membership::Stub;
using WorkerStub = v1::WorkerService::Stub;
using testing::BadRequest;
using testing::Metadata;
using testing::RawCall;
using testing::Text;
using Call = std::function<grpc::Status()>;
constexpr grpc::StatusCode kInvalid = grpc::StatusCode::INVALID_ARGUMENT;
constexpr grpc::StatusCode kNotFound = grpc::StatusCode::NOT_FOUND;
constexpr grpc::StatusCode kExists = grpc::StatusCode::ALREADY_EXISTS;
constexpr grpc::StatusCode kPrecondition = grpc::StatusCode::FAILED_PRECONDITION;
constexpr grpc::StatusCode kTooBig = grpc::StatusCode::RESOURCE_EXHAUSTED;
constexpr grpc::StatusCode kNoAuth = grpc::StatusCode::UNAUTHENTICATED;

constexpr char kJob[] = "mlp-demo";  // examples/mlp-job.yaml
constexpr char kIn[] = "job: 'mlp-demo' ";

class BadRequestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<testing::MlpCluster> started = testing::StartMlpCluster("bad-request", 2);
    ASSERT_TRUE(started.ok()) << started.status();
    ASSERT_EQ(started->spec.name(), kJob);
    cluster_ = std::move(started->cluster);
    client_ = std::move(started->client);
    spec_ = started->spec;

    auto channel = grpc::CreateChannel(cluster_->address(), grpc::InsecureChannelCredentials());
    jobs_ = v1::JobService::NewStub(channel);
    members_ = v1::Membership::NewStub(channel);
    for (const std::string& address : cluster_->worker_addresses()) {
      workers_.push_back(v1::WorkerService::NewStub(
          grpc::CreateChannel(address, grpc::InsecureChannelCredentials())));
    }
    token_ = {{kCommandTokenKey, cluster_->command_token()}};
    // A stale Abort needs a worker past epoch 1: abort rank 1's epoch, and
    // the next step recovers the job into epoch 2.
    ASSERT_TRUE(RawCall(*workers_[1], &WorkerStub::Abort,
                        Text<v1::AbortRequest>("reason: 'open epoch 2' job_epoch: 1"), token_)
                    .ok());
    ASSERT_TRUE(client_->Train(kJob, 1, 0, [](const v1::StepResult&) {}).ok());
    auto job = client_->GetJob(kJob);
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_EQ(job->epoch(), 2u);
    job_ = *job;
    v1::SaveCheckpointRequest save;
    save.set_job(kJob);
    save.set_name("base");
    ASSERT_TRUE(client_->SaveCheckpoint(save).ok());
    for (auto& worker : workers_) {
      ASSERT_TRUE(
          RawCall(*worker, &WorkerStub::GetStatus, {}, token_, &status_.emplace_back()).ok());
    }
    // A registered probe (a spare: no job rank) with a session for the store
    // calls, a counter at the top of int64 and a key that holds no integer.
    const auto probe = Text<v1::RegisterRequest>(
        "worker_id: 'probe' address: 'a:9' requested_rank: -1 identity_secret: 's'");
    v1::RegisterResponse registered;
    ASSERT_TRUE(RawCall(*members_, &MemberStub::Register, probe, {}, &registered).ok());
    session_ = {{kSessionKey, registered.session()}};
    v1::StoreAddRequest add;
    add.set_key("probe/counter");
    add.set_delta(std::numeric_limits<int64_t>::max());
    ASSERT_TRUE(RawCall(*members_, &MemberStub::StoreAdd, add, session_).ok());
    ASSERT_TRUE(RawCall(*members_, &MemberStub::StoreSet,
                        Text<v1::StoreSetRequest>("key: 'probe/text' value: 'abc'"), session_)
                    .ok());
  }
  void TearDown() override {
    if (cluster_ != nullptr) {
      EXPECT_TRUE(cluster_->Stop());
    }
  }

  std::string Snapshot() {
    return testing::ClusterSnapshot(*client_, kJob, workers_, token_, *members_, session_,
                                    {"probe/counter", "probe/text"}, "probe");
  }

  // Calls sending `request` through `method` of the JobService, Membership,
  // or worker i's WorkerService (with the command token unless told not to).
  template <typename Method, typename Request>
  Call J(Method method, Request request) {
    return [this, method, request] { return RawCall(*jobs_, method, request); };
  }
  template <typename Method, typename Request>
  Call M(Method method, Request request, Metadata metadata = {}) {
    return
        [this, method, request, metadata] { return RawCall(*members_, method, request, metadata); };
  }
  template <typename Method, typename Request>
  Call W(int i, Method method, Request request, bool token = true) {
    Metadata metadata = token ? token_ : Metadata();
    return [this, i, method, request, metadata] {
      return RawCall(*workers_[static_cast<size_t>(i)], method, request, metadata);
    };
  }
  Call Create(const std::function<void(v1::JobSpec&)>& mutate) {
    v1::CreateJobRequest request;
    *request.mutable_spec() = spec_;
    mutate(*request.mutable_spec());
    return J(&JobStub::CreateJob, request);
  }
  // A batch for worker i, `epochs` and `seqs` past the ones it expects.
  v1::CommandBatch Batch(int i, int64_t epochs, int64_t seqs, const std::string& kind) {
    auto batch = Text<v1::CommandBatch>(kind);
    const v1::GetStatusResponse& s = status_[static_cast<size_t>(i)];
    batch.set_job_epoch(static_cast<uint64_t>(static_cast<int64_t>(s.job_epoch()) + epochs));
    batch.set_seq(static_cast<uint64_t>(static_cast<int64_t>(s.last_completed_seq()) + 1 + seqs));
    batch.set_digest("forged");
    return batch;
  }
  v1::ConfigureRequest Configure(uint64_t epoch, int rank, int world) {
    v1::ConfigureRequest request;
    request.set_job(kJob);
    request.set_job_epoch(epoch);
    request.set_rank(rank);
    request.set_world_size(world);
    *request.mutable_spec() = job_.spec();
    *request.mutable_units() = job_.units();
    request.set_store_prefix("job/mlp-demo/forged");
    return request;
  }

  std::vector<BadRequest> JobServiceCases();
  std::vector<BadRequest> MembershipCases();
  std::vector<BadRequest> WorkerServiceCases();

  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<FlatshardClient> client_;
  v1::JobSpec spec_;
  v1::Job job_;
  std::unique_ptr<JobStub> jobs_;
  std::unique_ptr<MemberStub> members_;
  std::vector<std::unique_ptr<WorkerStub>> workers_;
  std::vector<v1::GetStatusResponse> status_;
  Metadata token_;    // the command token
  Metadata session_;  // the probe's session
};

std::vector<BadRequest> BadRequestTest::JobServiceCases() {
  const auto train = [&](const std::string& text) {
    return J(&JobStub::Train, Text<v1::TrainRequest>(kIn + text));
  };
  const auto save = [&](const std::string& text) {
    return J(&JobStub::SaveCheckpoint, Text<v1::SaveCheckpointRequest>(text));
  };
  const auto load = [&](const std::string& name) {
    return J(&JobStub::LoadCheckpoint, Text<v1::LoadCheckpointRequest>(kIn + name));
  };
  const auto settings = [&](const std::string& text) {
    return J(&JobStub::SetStateDictSettings, Text<v1::SetStateDictSettingsRequest>(kIn + text));
  };
  const auto summon = [&](const std::string& text) {
    return J(&JobStub::SummonFullParams, Text<v1::SummonFullParamsRequest>(kIn + text));
  };
  const auto ghost = [&](auto method, auto request) {
    request.set_job("ghost");
    return J(method, request);
  };
  v1::SetStateDictSettingsRequest unknown_type;
  unknown_type.set_job(kJob);
  unknown_type.mutable_settings()->set_state_dict_type(static_cast<v1::StateDictType>(99));
  v1::GetJobRequest huge;
  huge.set_name(std::string(100 << 10, 'j'));
  v1::PlanRequest too_big;
  *too_big.mutable_spec() = spec_;
  too_big.mutable_spec()->set_world_size(65536);
  too_big.mutable_spec()->mutable_data()->set_global_batch_size(65536);
  const std::string long_name = std::string(129, 'n');
  return {
      {"CreateJob without a name", Create([](v1::JobSpec& s) { s.clear_name(); }), kInvalid,
       "job.name"},
      {"CreateJob named '../etc'", Create([](v1::JobSpec& s) { s.set_name("../etc"); }), kInvalid,
       "job.name"},
      {"CreateJob with world_size 0", Create([](v1::JobSpec& s) { s.set_world_size(0); }), kInvalid,
       "job.world_size"},
      {"CreateJob with a negative batch",
       Create([](v1::JobSpec& s) { s.mutable_data()->set_global_batch_size(-8); }), kInvalid,
       "job.data.global_batch_size"},
      {"CreateJob with an unknown module type",
       Create([](v1::JobSpec& s) { s.mutable_model()->mutable_root()->set_type("Teleporter"); }),
       kInvalid, "Teleporter"},
      {"CreateJob with a negative lr",
       Create([](v1::JobSpec& s) { s.mutable_optimizer()->set_lr(-1); }), kInvalid,
       "job.optimizer.lr"},
      {"CreateJob with keep_last -1",
       Create([](v1::JobSpec& s) { s.mutable_checkpoints()->set_keep_last(-1); }), kInvalid,
       "job.checkpoints.keep_last"},
      {"CreateJob of the existing job", Create([](v1::JobSpec&) {}), kExists,
       "job 'mlp-demo' already exists"},
      {"CreateJob of a second job", Create([](v1::JobSpec& s) { s.set_name("second"); }),
       kPrecondition, "one job at a time"},
      {"CreateJob with a spec and a document",
       J(&JobStub::CreateJob,
         Text<v1::CreateJobRequest>("spec { name: 'x' } document { text: 'name: x' }")),
       kInvalid, "spec and document: send one"},
      {"CreateJob of an empty document",
       J(&JobStub::CreateJob, Text<v1::CreateJobRequest>("document { source: 'a.yaml' }")),
       kInvalid, "document.text"},
      {"CreateJob of a document naming a model file it did not send",
       J(&JobStub::CreateJob,
         Text<v1::CreateJobRequest>("document { source: 'job.yaml' text: 'name: x\\nmodel: "
                                    "/etc/passwd\\n' }")),
       kInvalid, "job.yaml:2: model: model file '/etc/passwd' is not in document.files"},
      {"CreateJob of a document with an unknown field",
       J(&JobStub::CreateJob,
         Text<v1::CreateJobRequest>("document { source: 'job.yaml' text: 'name: x\\nwrold: 1' }")),
       kInvalid, "job.yaml:2: wrold: unknown field"},
      {"Plan of a document whose model file is not YAML",
       J(&JobStub::Plan, Text<v1::PlanRequest>("document { source: 'j.yaml' text: 'model: m.yaml' "
                                               "files { key: 'm.yaml' value: '[: x' } }")),
       kInvalid, "m.yaml"},
      {"GetJob of an unknown job", J(&JobStub::GetJob, Text<v1::GetJobRequest>("name: 'ghost'")),
       kNotFound, "no job named 'ghost'"},
      {"GetJob without a name", J(&JobStub::GetJob, v1::GetJobRequest()), kInvalid,
       "job name must not be empty"},
      {"GetJob of 100 KiB", J(&JobStub::GetJob, huge), kTooBig, "request_bytes"},
      {"DeleteJob of an unknown job",
       J(&JobStub::DeleteJob, Text<v1::DeleteJobRequest>("name: 'ghost'")), kNotFound,
       "no job named 'ghost'"},
      {"Plan with world_size 0",
       J(&JobStub::Plan, Text<v1::PlanRequest>("spec { name: 'p' world_size: 0 }")), kInvalid,
       "job.world_size"},
      {"Plan of 65536 ranks", J(&JobStub::Plan, too_big), kTooBig, "plan: world_size 65536"},
      {"ListWorkers of an unknown job", ghost(&JobStub::ListWorkers, v1::ListWorkersRequest()),
       kNotFound, "no job named 'ghost'"},
      {"Train 0 steps", train("steps: 0"), kInvalid, "train.steps"},
      {"Train past the last step", train("steps: 9223372036854775807"), kInvalid, "train.steps"},
      {"Train with -1 micro-steps", train("steps: 1 no_sync_micro_steps: -1"), kInvalid,
       "train.no_sync_micro_steps"},
      {"Train with 2^31-1 micro-steps", train("steps: 1 no_sync_micro_steps: 2147483647"), kInvalid,
       "train.no_sync_micro_steps must be between 0 and 1024"},
      {"Train with attach and detach", train("steps: 1 attach: true detach: true"), kInvalid,
       "attach and detach"},
      {"Train attaching to no training", train("attach: true"), kPrecondition, "is not training"},
      {"StopTraining of no training",
       J(&JobStub::StopTraining, Text<v1::StopTrainingRequest>("job: 'mlp-demo'")), kPrecondition,
       "is not training"},
      {"Unshard unit 99",
       J(&JobStub::Unshard, Text<v1::UnshardRequest>("job: 'mlp-demo' unit_indices: [0, 99]")),
       kInvalid, "unit_indices: unit 99"},
      {"Reshard unit -1",
       J(&JobStub::Reshard, Text<v1::ReshardRequest>("job: 'mlp-demo' unit_indices: -1")), kInvalid,
       "unit_indices: unit -1"},
      {"SummonFullParams of -1-byte chunks", summon("chunk_bytes: -1"), kInvalid, "chunk_bytes"},
      {"SummonFullParams with_grads without use_orig_params", summon("with_grads: true"), kInvalid,
       "sharding.use_orig_params"},
      {"SetStateDictSettings with state_dict_type 99",
       J(&JobStub::SetStateDictSettings, unknown_type), kInvalid, "settings.state_dict_type"},
      {"SetStateDictSettings SHARDED with rank0_only",
       settings("settings { state_dict_type: SHARDED_STATE_DICT "
                "state_dict_config { rank0_only: true } }"),
       kInvalid, "settings.state_dict_config.rank0_only"},
      {"SetStateDictSettings LOCAL with optimizer rank0_only",
       settings("settings { state_dict_type: LOCAL_STATE_DICT "
                "optim_state_dict_config { rank0_only: true } }"),
       kInvalid, "settings.optim_state_dict_config.rank0_only"},
      {"SaveCheckpoint named 'a/b'", save("job: 'mlp-demo' name: 'a/b'"), kInvalid,
       "checkpoint name 'a/b'"},
      {"SaveCheckpoint named '..'", save("job: 'mlp-demo' name: '..'"), kInvalid,
       "checkpoint name '..'"},
      {"SaveCheckpoint named 'x.partial'", save("job: 'mlp-demo' name: 'x.partial'"), kInvalid,
       "checkpoint name 'x.partial'"},
      {"SaveCheckpoint with a 129-character name",
       save(absl::StrCat("job: 'mlp-demo' name: '", long_name, "'")), kInvalid,
       "longer than 128 characters"},
      {"SaveCheckpoint without a job", save("name: 'x'"), kInvalid, "job name must not be empty"},
      {"SaveCheckpoint over an existing one", save("job: 'mlp-demo' name: 'base'"), kExists,
       "checkpoint 'base'"},
      {"LoadCheckpoint of a missing checkpoint", load("name: 'nope'"), kNotFound,
       "no checkpoint 'nope'"},
      {"LoadCheckpoint without a name", load(""), kInvalid, "name is empty"},
      {"DeleteCheckpoint of a missing checkpoint",
       J(&JobStub::DeleteCheckpoint,
         Text<v1::DeleteCheckpointRequest>("job: 'mlp-demo' name: 'nope'")),
       kNotFound, "no checkpoint 'nope'"},
      {"ListCheckpoints of an unknown job",
       ghost(&JobStub::ListCheckpoints, v1::ListCheckpointsRequest()), kNotFound,
       "no job named 'ghost'"},
      {"WatchEvents of an unknown job", ghost(&JobStub::WatchEvents, v1::WatchEventsRequest()),
       kNotFound, "no job named 'ghost'"},
  };
}

std::vector<BadRequest> BadRequestTest::MembershipCases() {
  const auto reg = [&](const std::string& text) {
    return M(&MemberStub::Register, Text<v1::RegisterRequest>(text));
  };
  const std::string big(300, 'x');
  auto long_id = Text<v1::RegisterRequest>("address: 'a:1' requested_rank: -1");
  long_id.set_worker_id(big);
  v1::HeartbeatRequest long_state;
  long_state.set_worker_id("probe");
  long_state.set_state(big);
  v1::StoreWaitRequest many;
  for (int k = 0; k <= MembershipService::kMaxWaitKeys; ++k) many.add_keys(absl::StrCat("k", k));
  v1::StoreSetRequest long_key;
  long_key.set_key(std::string(1025, 'k'));
  v1::StoreSetRequest big_value;
  big_value.set_key("probe/big");
  big_value.set_value(std::string((1 << 20) + 1, 'v'));
  const auto wait = [&](const std::string& text, Metadata metadata) {
    return M(&MemberStub::StoreWait, Text<v1::StoreWaitRequest>(text), std::move(metadata));
  };
  const auto add = [&](const std::string& text, Metadata metadata) {
    return M(&MemberStub::StoreAdd, Text<v1::StoreAddRequest>(text), std::move(metadata));
  };
  const std::string needs = " needs a registered worker's session";
  return {
      {"Register without a worker_id", reg("address: 'a:1'"), kInvalid, "register.worker_id"},
      {"Register without an address", reg("worker_id: 'w'"), kInvalid, "register.address"},
      {"Register an unknown device", reg("worker_id: 'w' address: 'a:1' device: 'tpu'"), kInvalid,
       "register.device"},
      {"Register requested_rank -2", reg("worker_id: 'w' address: 'a:1' requested_rank: -2"),
       kInvalid, "register.requested_rank"},
      {"Register a taken requested_rank", reg("worker_id: 'w' address: 'a:1' requested_rank: 0"),
       kExists, "register.requested_rank"},
      {"Register a 300-byte worker_id", M(&MemberStub::Register, long_id), kTooBig,
       "register.worker_id"},
      {"Register a live worker's id",
       reg("worker_id: 'worker-0' address: 'a:1' requested_rank: -1 identity_secret: 's'"),
       grpc::StatusCode::PERMISSION_DENIED, "worker id 'worker-0'"},
      {"Heartbeat of an unknown worker",
       M(&MemberStub::Heartbeat, Text<v1::HeartbeatRequest>("worker_id: 'ghost'"), session_),
       kNotFound, "worker 'ghost' is not registered"},
      {"Heartbeat with another worker's session",
       M(&MemberStub::Heartbeat, Text<v1::HeartbeatRequest>("worker_id: 'worker-0'"), session_),
       kNotFound, "with this session"},
      {"Heartbeat with a 300-byte state", M(&MemberStub::Heartbeat, long_state, session_), kTooBig,
       "heartbeat.state"},
      {"StoreSet without a session",
       M(&MemberStub::StoreSet, Text<v1::StoreSetRequest>("key: 'probe/text' value: 'x'")), kNoAuth,
       "StoreSet" + needs},
      {"StoreWait with a forged session", wait("keys: 'probe/text'", {{kSessionKey, "forged"}}),
       kNoAuth, "StoreWait" + needs},
      {"StoreAdd without a session", add("key: 'probe/counter' delta: -1", {}), kNoAuth,
       "StoreAdd" + needs},
      {"StoreWait without keys", wait("", session_), kInvalid, "store_wait.keys"},
      {"StoreWait with timeout_ms -1", wait("keys: 'probe/text' timeout_ms: -1", session_),
       kInvalid, "store_wait.timeout_ms"},
      {"StoreWait past the longest wait", wait("keys: 'probe/text' timeout_ms: 600001", session_),
       kInvalid, "store_wait.timeout_ms"},
      {"StoreWait for 4097 keys", M(&MemberStub::StoreWait, many, session_), kTooBig,
       "store_wait.keys"},
      {"StoreSet a 1025-byte key", M(&MemberStub::StoreSet, long_key, session_), kInvalid,
       "key is 1025 bytes"},
      {"StoreSet a value over 1 MiB", M(&MemberStub::StoreSet, big_value, session_), kInvalid,
       "value for key 'probe/big'"},
      {"StoreAdd past int64", add("key: 'probe/counter' delta: 1", session_), kInvalid,
       "store_add.delta"},
      {"StoreAdd on a non-integer", add("key: 'probe/text' delta: 1", session_), kInvalid,
       "key 'probe/text' does not hold an integer"},
  };
}

std::vector<BadRequest> BadRequestTest::WorkerServiceCases() {
  const auto needs = [](const char* call) {
    return absl::StrCat("WorkerService.", call, " needs the command token");
  };
  const std::string barrier = "control { commands { barrier {} } }";
  v1::ConfigureRequest unnamed = Configure(3, 0, 2);
  unnamed.mutable_spec()->clear_name();
  v1::ConfigureRequest no_units = Configure(3, 0, 2);
  no_units.clear_units();
  return {
      {"Configure without the token", W(0, &WorkerStub::Configure, Configure(3, 0, 2), false),
       kNoAuth, needs("Configure")},
      {"Execute without the token", W(0, &WorkerStub::Execute, Batch(0, 0, 0, barrier), false),
       kNoAuth, needs("Execute")},
      {"Summon without the token", W(0, &WorkerStub::Summon, Batch(0, 0, 0, "summon {}"), false),
       kNoAuth, needs("Summon")},
      {"GetStatus without the token", W(1, &WorkerStub::GetStatus, v1::GetStatusRequest(), false),
       kNoAuth, needs("GetStatus")},
      {"AwaitSave without the token", W(1, &WorkerStub::AwaitSave, v1::AwaitSaveRequest(), false),
       kNoAuth, needs("AwaitSave")},
      {"Abort without the token", W(1, &WorkerStub::Abort, v1::AbortRequest(), false), kNoAuth,
       needs("Abort")},
      {"Execute of the last epoch", W(0, &WorkerStub::Execute, Batch(0, -1, 0, barrier)),
       kPrecondition, "it is for job epoch 1, this worker is in epoch 2"},
      {"Execute out of order", W(1, &WorkerStub::Execute, Batch(1, 0, 4, barrier)), kPrecondition,
       "out of order, expected seq"},
      {"Execute without a kind", W(0, &WorkerStub::Execute, Batch(0, 0, 0, "")), kInvalid,
       "its kind is not set"},
      {"Execute with a forged digest", W(1, &WorkerStub::Execute, Batch(1, 0, 0, barrier)),
       kInvalid, "digest mismatch"},
      {"Execute of a summon batch", W(0, &WorkerStub::Execute, Batch(0, 0, 0, "summon {}")),
       kInvalid, "a summon batch goes through WorkerService.Summon"},
      {"Summon of a step batch", W(0, &WorkerStub::Summon, Batch(0, 0, 0, "step { step: 1 }")),
       kInvalid, "goes through WorkerService.Execute"},
      {"Configure epoch 0", W(0, &WorkerStub::Configure, Configure(0, 0, 2)), kInvalid,
       "job_epoch must be positive"},
      {"Configure rank 5 of 2", W(1, &WorkerStub::Configure, Configure(3, 5, 2)), kInvalid,
       "rank 5 is outside a world of size 2"},
      {"Configure a world_size the spec does not have",
       W(1, &WorkerStub::Configure, Configure(3, 0, 3)), kInvalid, "configure: world_size 3"},
      {"Configure an invalid spec", W(0, &WorkerStub::Configure, unnamed), kInvalid, "job.name"},
      {"Configure with units of another cut", W(1, &WorkerStub::Configure, no_units), kPrecondition,
       "units"},
      {"AwaitSave of no save",
       W(0, &WorkerStub::AwaitSave, Text<v1::AwaitSaveRequest>("directory: 'mlp-demo/x'")),
       kNotFound, "no async save into 'mlp-demo/x'"},
      {"Abort of an older epoch",
       W(1, &WorkerStub::Abort, Text<v1::AbortRequest>("reason: 'stale' job_epoch: 1")),
       kPrecondition, "abort.job_epoch 1 is older than this worker's epoch 2"},
  };
}

TEST_F(BadRequestTest, EveryBadRequestIsRefusedPreciselyAndChangesNothing) {
  std::vector<BadRequest> cases = JobServiceCases();
  for (std::vector<BadRequest> more : {MembershipCases(), WorkerServiceCases()}) {
    for (BadRequest& c : more) cases.push_back(std::move(c));
  }
  EXPECT_GE(cases.size(), 45u);
  const std::string before = Snapshot();
  std::set<std::string> names;
  for (const BadRequest& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_TRUE(names.insert(c.name).second) << "two cases of this name";
    const grpc::Status status = c.call();
    EXPECT_EQ(status.error_code(), c.code) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(c.message));
    EXPECT_EQ(Snapshot(), before);
  }
  // The job still trains, in the same epoch.
  int steps = 0;
  ASSERT_TRUE(client_->Train(kJob, 1, 0, [&](const v1::StepResult&) { ++steps; }).ok());
  EXPECT_EQ(steps, 1);
  auto job = client_->GetJob(kJob);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->step(), job_.step() + 1);
  EXPECT_EQ(job->epoch(), 2u);
}

}  // namespace
}  // namespace flatshard
