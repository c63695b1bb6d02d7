// Fuzz target for every RPC request flatshard's daemons accept: JobService
// (proto/flatshard/v1/job.proto), Membership (membership.proto) and
// WorkerService (worker.proto, CommandBatch included). The first byte picks
// the message type (modulo their number), the rest is parsed with
// ParseFromArray as gRPC would, and the message goes through the pure
// validation and conversion the services apply before acting: job specs
// through JobConfigFromProto, models and wrap policies through their wire
// conversions, command batches through rpc/command_batch.h and
// rpc/step_program_proto.h, checkpoint names, state-dict types, device kinds.
// The services themselves are not run: they need a cluster.
//
// Asserts: every parsed request re-serializes to stable bytes; an accepted
// job is self-consistent (job_checks.h); an accepted batch's digest is 16
// bytes, survives the wire, and equals the digest of the batch rebuilt from
// core's program (what the worker's digest check relies on); an accepted
// checkpoint name is one safe path component; names of kinds round-trip.
// Seeds (corpus/rpc_request): one valid request of each type and each batch
// kind, written by `--write-seeds`, named after the type.
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "rpc/command_batch.h"
#include "rpc/step_program_proto.h"

#include "core/device_kind.h"
#include "core/job_config.h"
#include "core/job_spec_yaml.h"
#include "core/model_spec.h"
#include "core/model_spec_proto.h"
#include "core/step_program.h"
#include "flatshard/v1/job.pb.h"
#include "flatshard/v1/membership.pb.h"
#include "flatshard/v1/worker.pb.h"
#include "storage/checkpoint_manifest.h"
#include "tests/fuzz/fuzz_driver.h"
#include "tests/fuzz/job_checks.h"

namespace flatshard::fuzz {
namespace {

using google::protobuf::Message;

// A request type and the checks a parsed one goes through; `check` returns
// whether the services' validation would accept it.
struct RequestType {
  const Message* prototype;
  std::function<bool(const Message&)> check;
};

template <typename T>
RequestType Type(bool (*check)(const T&)) {
  return {&T::default_instance(),
          [check](const Message& m) { return check(static_cast<const T&>(m)); }};
}

template <typename T>
RequestType Unchecked() {  // the services take any value of these
  return {&T::default_instance(), [](const Message&) { return true; }};
}

bool CheckSpec(const v1::JobSpec& spec) {
  if (spec.has_model()) {
    // The model's own conversion, whatever the rest of the job says.
    absl::StatusOr<ModelSpec> model = ModelSpecFromProto(spec.model());
    if (model.ok()) CheckAcceptedModel(*model);
  }
  absl::StatusOr<JobConfig> config = JobConfigFromProto(spec);
  if (!config.ok()) return false;
  CheckAcceptedJob(spec, *config);
  return true;
}

// Through the services' own path: a spec as sent, or a job document parsed.
template <typename Request>
bool CheckJobRequest(const Request& r) {
  absl::StatusOr<v1::JobSpec> spec = RequestedJobSpec(r);
  return spec.ok() && CheckSpec(*spec);
}
bool CheckCreateJob(const v1::CreateJobRequest& r) { return CheckJobRequest(r); }
bool CheckPlan(const v1::PlanRequest& r) { return CheckJobRequest(r); }

bool CheckConfigure(const v1::ConfigureRequest& r) {
  if (!CheckSpec(r.spec())) return false;
  return r.world_size() == r.spec().world_size() && r.rank() >= 0 && r.rank() < r.world_size() &&
         r.job_epoch() > 0 && !r.store_prefix().empty();
}

void CheckStateDictType(v1::StateDictType type) {
  absl::StatusOr<v1::StateDictType> back = ParseStateDictType(StateDictTypeName(type));
  FUZZ_CHECK(back.ok(), back.status().ToString());
  FUZZ_CHECK(
      *back == type || type == v1::STATE_DICT_TYPE_UNSPECIFIED || !v1::StateDictType_IsValid(type),
      absl::StrCat("state dict type ", type, " does not round-trip its name"));
}

// The catalog joins an accepted name to its root: it must stay one component.
bool CheckCheckpointName(const std::string& name) {
  if (!ValidateCheckpointName(name).ok()) return false;
  FUZZ_CHECK(name.find('/') == std::string::npos && name != "." && name != ".." &&
                 name.front() != '.' && !absl::EndsWith(name, std::string(kPartialSuffix)),
             absl::StrCat("accepted the checkpoint name '", name, "'"));
  return true;
}

bool CheckSetStateDict(const v1::SetStateDictSettingsRequest& r) {
  CheckStateDictType(r.settings().state_dict_type());
  return true;
}

bool CheckSave(const v1::SaveCheckpointRequest& r) {
  CheckStateDictType(r.settings().state_dict_type());
  return r.name().empty() || CheckCheckpointName(r.name());  // empty: a generated name
}
bool CheckLoad(const v1::LoadCheckpointRequest& r) { return CheckCheckpointName(r.name()); }
bool CheckDelete(const v1::DeleteCheckpointRequest& r) { return CheckCheckpointName(r.name()); }

bool CheckRegister(const v1::RegisterRequest& r) {
  absl::StatusOr<DeviceKind> kind = ParseDeviceKind(r.device());
  if (!kind.ok()) return false;
  FUZZ_CHECK(DeviceKindName(*kind) == r.device(), "a device kind does not round-trip its name");
  return true;
}

// What both daemons do with a batch: the sequencer's digest on one side, the
// worker's conversion and re-digest on the other.
bool CheckBatch(const v1::CommandBatch& batch) {
  absl::StatusOr<std::string> digest = BatchDigest(batch);
  if (!digest.ok()) return false;
  FUZZ_CHECK(digest->size() == 16, absl::StrCat("a digest of ", digest->size(), " bytes"));
  FUZZ_CHECK(BatchKindName(batch.kind_case()) != "unset", "a batch without a kind has a digest");
  v1::CommandBatch received;
  FUZZ_CHECK(received.ParseFromString(CanonicalBytes(batch)), "a batch does not parse");
  absl::StatusOr<std::string> received_digest = BatchDigest(received);
  FUZZ_CHECK(received_digest.ok() && *received_digest == *digest,
             "a batch's digest changed through the wire");
  const bool step = batch.has_step();
  if (!step && !batch.has_control()) return true;
  const auto& commands = step ? batch.step().commands() : batch.control().commands();
  absl::StatusOr<StepProgram> program = StepProgramFromProto(commands, "commands");
  FUZZ_CHECK(program.ok(), program.status().ToString());
  for (const StepCommand& command : *program) (void)DescribeCommand(command);
  const v1::CommandBatch rebuilt =
      step ? MakeStepBatch(*program, batch.step().step(), batch.step().sync_gradients())
           : MakeControlBatch(*program);
  absl::StatusOr<std::string> rebuilt_digest = BatchDigest(rebuilt);
  FUZZ_CHECK(rebuilt_digest.ok() && *rebuilt_digest == *digest,
             "the batch rebuilt from core's program has another digest");
  // A step batch carries MakeStepBatch's digest, which the sequencer sends
  // as is: it must be the one a worker computes from the content.
  FUZZ_CHECK(!step || rebuilt.digest() == *digest,
             "MakeStepBatch stamped another digest than its content's");
  return true;
}

// Append only: a seed's first byte is its type's index here.
const std::vector<RequestType>& RequestTypes() {
  static const auto* const kTypes = new std::vector<RequestType>{
      // JobService
      Type<v1::CreateJobRequest>(CheckCreateJob),
      Unchecked<v1::GetJobRequest>(),
      Unchecked<v1::DeleteJobRequest>(),
      Type<v1::PlanRequest>(CheckPlan),
      Unchecked<v1::ListWorkersRequest>(),
      Unchecked<v1::TrainRequest>(),
      Unchecked<v1::StopTrainingRequest>(),
      Unchecked<v1::UnshardRequest>(),
      Unchecked<v1::ReshardRequest>(),
      Unchecked<v1::SummonFullParamsRequest>(),
      Type<v1::SetStateDictSettingsRequest>(CheckSetStateDict),
      Type<v1::SaveCheckpointRequest>(CheckSave),
      Type<v1::LoadCheckpointRequest>(CheckLoad),
      Unchecked<v1::ListCheckpointsRequest>(),
      Type<v1::DeleteCheckpointRequest>(CheckDelete),
      Unchecked<v1::WatchEventsRequest>(),
      // Membership
      Type<v1::RegisterRequest>(CheckRegister),
      Unchecked<v1::HeartbeatRequest>(),
      Unchecked<v1::StoreSetRequest>(),
      Unchecked<v1::StoreGetRequest>(),
      Unchecked<v1::StoreWaitRequest>(),
      Unchecked<v1::StoreAddRequest>(),
      // WorkerService (Execute and Summon both take a CommandBatch)
      Type<v1::ConfigureRequest>(CheckConfigure),
      Type<v1::CommandBatch>(CheckBatch),
      Unchecked<v1::GetStatusRequest>(),
      Unchecked<v1::AwaitSaveRequest>(),
      Unchecked<v1::AbortRequest>(),
      // Added later (append only)
      Unchecked<v1::ListJobsRequest>(),
  };
  return *kTypes;
}

size_t TypeIndex(const Message& prototype) {
  const std::vector<RequestType>& types = RequestTypes();
  for (size_t i = 0; i < types.size(); ++i) {
    if (types[i].prototype->GetDescriptor() == prototype.GetDescriptor()) return i;
  }
  FUZZ_CHECK(false, absl::StrCat(prototype.GetTypeName(), " is not a request type"));
  return 0;
}

Seed MakeSeed(const Message& request, absl::string_view suffix = "") {
  const size_t index = TypeIndex(request);
  std::string name = absl::StrCat(index < 10 ? "0" : "", index, "-",
                                  request.GetDescriptor()->name(), suffix, ".bin");
  return {std::move(name), std::string(1, static_cast<char>(index)) + CanonicalBytes(request)};
}

}  // namespace

bool FuzzOneInput(absl::string_view input) {
  if (input.empty()) return false;
  const std::vector<RequestType>& types = RequestTypes();
  const RequestType& type = types[static_cast<unsigned char>(input[0]) % types.size()];
  std::unique_ptr<Message> request(type.prototype->New());
  if (!request->ParseFromArray(input.data() + 1, static_cast<int>(input.size() - 1))) {
    return false;
  }
  CheckWireRoundTrip(*request);
  return type.check(*request);
}

std::vector<Seed> GeneratedSeeds(const std::vector<Seed>& /*corpus*/) {
  const v1::JobSpec spec = SampleJobSpec();
  const std::string& job = spec.name();
  std::vector<Seed> seeds;
  const auto add = [&](const Message& request, absl::string_view suffix = "") {
    seeds.push_back(MakeSeed(request, suffix));
  };
  // JobService
  v1::CreateJobRequest create;
  *create.mutable_spec() = spec;
  add(create);
  v1::CreateJobRequest document;
  document.mutable_document()->set_source("job.yaml");
  document.mutable_document()->set_text(
      "name: doc\nmodel: m.yaml\nwrap_policy: module-type:Residual\nworld_size: 2\n"
      "data: {kind: regression, global_batch_size: 8}\n");
  (*document.mutable_document()->mutable_files())["m.yaml"] =
      "root:\n  type: Sequential\n  children:\n"
      "    - {name: fc, type: Linear, in_features: 4, out_features: 4}\n";
  add(document, "document");
  v1::GetJobRequest get;
  get.set_name(job);
  add(get);
  add(v1::ListJobsRequest());
  v1::DeleteJobRequest remove;
  remove.set_name(job);
  add(remove);
  v1::PlanRequest plan;
  *plan.mutable_spec() = spec;
  add(plan);
  v1::ListWorkersRequest workers;
  workers.set_job(job);
  add(workers);
  v1::TrainRequest train;
  train.set_job(job);
  train.set_steps(100);
  train.set_no_sync_micro_steps(1);
  train.set_detach(true);
  train.set_started_by("user@host");
  add(train);
  v1::StopTrainingRequest stop;
  stop.set_job(job);
  add(stop);
  v1::UnshardRequest unshard;
  unshard.set_job(job);
  unshard.add_unit_indices(0);
  unshard.add_unit_indices(2);
  add(unshard);
  v1::ReshardRequest reshard;
  reshard.set_job(job);
  reshard.add_unit_indices(1);
  add(reshard);
  v1::SummonFullParamsRequest summon;
  summon.set_job(job);
  summon.set_with_grads(true);
  summon.set_chunk_bytes(int64_t{1} << 20);
  add(summon);
  v1::SetStateDictSettingsRequest settings;
  settings.set_job(job);
  settings.mutable_settings()->set_state_dict_type(v1::SHARDED_STATE_DICT);
  settings.mutable_settings()->mutable_state_dict_config()->set_offload_to_cpu(true);
  add(settings);
  v1::SaveCheckpointRequest save;
  save.set_job(job);
  save.set_name("step-40");
  save.mutable_settings()->set_state_dict_type(v1::FULL_STATE_DICT);
  save.mutable_settings()->mutable_state_dict_config()->set_rank0_only(true);
  save.set_async_save(true);
  add(save);
  v1::LoadCheckpointRequest load;
  load.set_job(job);
  load.set_name("step-40");
  add(load);
  v1::ListCheckpointsRequest list;
  list.set_job(job);
  add(list);
  v1::DeleteCheckpointRequest remove_checkpoint;
  remove_checkpoint.set_job(job);
  remove_checkpoint.set_name("step-40");
  add(remove_checkpoint);
  v1::WatchEventsRequest watch;
  watch.set_job(job);
  add(watch);
  // Membership
  v1::RegisterRequest enroll;
  enroll.set_worker_id("w0");
  enroll.set_host("node-1");
  enroll.set_device("cpu");
  enroll.set_address("10.0.0.2:7001");
  enroll.set_requested_rank(-1);
  enroll.set_memory_bytes(int64_t{1} << 34);
  enroll.set_metrics_address("10.0.0.2:9100");
  enroll.set_device_name("cpu");
  add(enroll);
  v1::HeartbeatRequest heartbeat;
  heartbeat.set_worker_id("w0");
  heartbeat.set_last_completed_seq(12);
  heartbeat.set_state("ready");
  add(heartbeat);
  v1::StoreSetRequest store_set;
  store_set.set_key("mlp-demo/1/gloo/0");
  store_set.set_value(std::string("\x00\x01\xfe\xff", 4));
  add(store_set);
  v1::StoreGetRequest store_get;
  store_get.set_key("mlp-demo/1/gloo/0");
  add(store_get);
  v1::StoreWaitRequest store_wait;
  store_wait.add_keys("mlp-demo/1/gloo/0");
  store_wait.add_keys("mlp-demo/1/gloo/1");
  store_wait.set_timeout_ms(1000);
  add(store_wait);
  v1::StoreAddRequest store_add;
  store_add.set_key("mlp-demo/1/barrier");
  store_add.set_delta(1);
  add(store_add);
  // WorkerService
  absl::StatusOr<JobConfig> config = JobConfigFromProto(spec);
  FUZZ_CHECK(config.ok(), config.status().ToString());
  absl::StatusOr<std::vector<Unit>> units = JobUnits(*config);
  FUZZ_CHECK(units.ok(), units.status().ToString());
  v1::ConfigureRequest configure;
  configure.set_job(job);
  configure.set_job_epoch(1);
  configure.set_rank(1);
  configure.set_world_size(spec.world_size());
  *configure.mutable_spec() = spec;
  for (const Unit& unit : *units) *configure.add_units() = UnitToProto(unit);
  configure.set_store_prefix("mlp-demo/1/");
  add(configure);
  absl::StatusOr<ModelIndex> index = IndexModel(config->model);
  FUZZ_CHECK(index.ok(), index.status().ToString());
  const StepProgram program = CompileStepProgram(
      *index, *units,
      StepProgramOptionsFor(config->sharding, config->optimizer, config->world_size, true));
  std::vector<std::pair<std::string, v1::CommandBatch>> batches;
  batches.emplace_back("-step", MakeStepBatch(program, 3, true));
  batches.emplace_back("-control",
                       MakeControlBatch({StepCommand::Unshard(0, false), StepCommand::Reshard(0),
                                         StepCommand::Barrier()}));
  v1::CommandBatch save_shard;
  save_shard.mutable_checkpoint()->mutable_save_shard()->set_directory("mlp-demo/step-40.partial");
  save_shard.mutable_checkpoint()->mutable_save_shard()->set_async_save(true);
  batches.emplace_back("-save", save_shard);
  v1::CommandBatch load_shard;
  load_shard.mutable_checkpoint()->mutable_load_shard()->set_directory("mlp-demo/step-40");
  load_shard.mutable_checkpoint()->mutable_load_shard()->set_apply(true);
  batches.emplace_back("-load", load_shard);
  v1::CommandBatch take;
  take.mutable_checkpoint()->mutable_take_peer_snapshot()->set_step(10);
  batches.emplace_back("-snapshot", take);
  v1::CommandBatch restore;
  v1::CheckpointBatch::RestorePeerSnapshot* r =
      restore.mutable_checkpoint()->mutable_restore_peer_snapshot();
  r->set_step(10);
  r->set_from_epoch(1);
  r->set_from_world_size(4);
  for (int holder : {1, 2, 3, 0}) r->add_holder(holder);
  batches.emplace_back("-restore", restore);
  v1::CommandBatch summon_batch;
  summon_batch.mutable_summon()->set_with_grads(true);
  summon_batch.mutable_summon()->set_chunk_bytes(int64_t{1} << 20);
  batches.emplace_back("-summon", summon_batch);
  uint64_t seq = 1;
  for (auto& [suffix, batch] : batches) {
    batch.set_job_epoch(1);
    batch.set_seq(seq++);
    absl::StatusOr<std::string> digest = BatchDigest(batch);
    FUZZ_CHECK(digest.ok(), digest.status().ToString());
    batch.set_digest(*digest);
    add(batch, suffix);
  }
  add(v1::GetStatusRequest());
  v1::AwaitSaveRequest await_save;
  await_save.set_directory("mlp-demo/step-40.partial");
  add(await_save);
  v1::AbortRequest abort;
  abort.set_reason("rank 2 failed");
  add(abort);
  return seeds;
}

}  // namespace flatshard::fuzz
