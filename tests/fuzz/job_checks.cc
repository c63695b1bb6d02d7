#include "tests/fuzz/job_checks.h"

#include <memory>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/util/field_comparator.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "nlohmann/json.hpp"
#include "rpc/command_batch.h"
#include "rpc/step_program_proto.h"

#include "core/job_spec_yaml.h"
#include "core/model_spec_proto.h"
#include "core/plan.h"
#include "core/step_program.h"
#include "core/wrap_policy_proto.h"
#include "storage/spec_files.h"
#include "tests/fuzz/fuzz_driver.h"

namespace flatshard::fuzz {
namespace {

// examples/mlp-job.yaml with the model inline and smaller, so a seed is a few
// hundred bytes and one run takes microseconds.
constexpr char kSampleJobYaml[] = R"(name: mlp-demo
model:
  name: mlp-small
  root:
    type: Sequential
    children:
      - {name: input, type: Linear, in_features: 8, out_features: 16}
      - name: blocks
        type: ModuleList
        repeat: 2
        template:
          type: Residual
          children:
            - {name: fc1, type: Linear, in_features: 16, out_features: 32}
            - {name: act, type: GELU}
            - {name: fc2, type: Linear, in_features: 32, out_features: 16}
      - {name: norm, type: LayerNorm, normalized_shape: 16}
      - {name: output, type: Linear, in_features: 16, out_features: 4}
wrap_policy: module-type:Residual
world_size: 4
seed: 0
sharding:
  strategy: FULL_SHARD
  mixed_precision: {param_dtype: bfloat16, reduce_dtype: float32}
optimizer: {kind: adamw, lr: 0.003, max_grad_norm: 1.0}
data: {kind: regression, global_batch_size: 32, seed: 1}
state_dict: {type: FULL_STATE_DICT, offload_to_cpu: true, rank0_only: true}
checkpoints: {every_steps: 0, keep_last: 3}
)";

std::string UnitsBytes(const std::vector<Unit>& units) {
  std::string bytes;
  for (const Unit& unit : units) bytes += CanonicalBytes(UnitToProto(unit));
  return bytes;
}

void CheckUnits(const JobConfig& config, const std::vector<Unit>& units) {
  absl::StatusOr<ModelIndex> index = IndexModel(config.model);
  FUZZ_CHECK(index.ok(), index.status().ToString());
  FUZZ_CHECK(!units.empty(), "an accepted job has no units");
  std::set<int> placed;
  int64_t numel = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    FUZZ_CHECK(units[u].index == static_cast<int>(u), absl::StrCat("unit ", u, " is misnumbered"));
    int64_t unit_numel = 0;
    for (const UnitParam& param : units[u].params) {
      const size_t p = static_cast<size_t>(param.param_index);
      FUZZ_CHECK(p < index->params.size() && index->params[p].primary == param.param_index,
                 absl::StrCat(param.fqn, " is in a unit but is not a primary parameter"));
      FUZZ_CHECK(placed.insert(param.param_index).second,
                 absl::StrCat(param.fqn, " is in two units"));
      unit_numel += param.numel;
    }
    FUZZ_CHECK(unit_numel == units[u].numel, absl::StrCat("unit ", u, "'s numel is not its sum"));
    numel += unit_numel;
  }
  size_t primaries = 0;
  for (size_t p = 0; p < index->params.size(); ++p) {
    if (index->params[p].primary == static_cast<int>(p)) ++primaries;
  }
  FUZZ_CHECK(placed.size() == primaries, "a primary parameter is in no unit");
  FUZZ_CHECK(numel == index->TotalNumel(), "the units' numels do not add up to the model's");
}

// What the coordinator sends a worker: the model and policy in wire form. The
// worker must arrive at the same job.
void CheckNormalizedSpec(const v1::JobSpec& spec, const JobConfig& config,
                         const std::vector<Unit>& units) {
  v1::JobSpec normalized = spec;
  *normalized.mutable_model() = ModelSpecToProto(config.model);
  *normalized.mutable_wrap_policy() = WrapPolicyToProto(config.wrap_policy);
  CheckWireRoundTrip(normalized);
  absl::StatusOr<JobConfig> again = JobConfigFromProto(normalized);
  FUZZ_CHECK(again.ok(), again.status().ToString());
  FUZZ_CHECK(CanonicalBytes(ModelSpecToProto(again->model)) == CanonicalBytes(normalized.model()),
             "the model changed on its way through the wire form");
  absl::StatusOr<std::vector<Unit>> again_units = JobUnits(*again);
  FUZZ_CHECK(again_units.ok(), again_units.status().ToString());
  FUZZ_CHECK(UnitsBytes(*again_units) == UnitsBytes(units),
             "the units changed on their way through the wire form");
}

// The coordinator compiles and digests a step; the worker converts the batch
// back and compares digests. Both must agree on anything compiled.
void CheckStepPrograms(const JobConfig& config, const std::vector<Unit>& units) {
  absl::StatusOr<ModelIndex> index = IndexModel(config.model);
  FUZZ_CHECK(index.ok(), index.status().ToString());
  for (const bool sync : {true, false}) {
    const StepProgramOptions options =
        StepProgramOptionsFor(config.sharding, config.optimizer, config.world_size, sync);
    const StepProgram program = CompileStepProgram(*index, units, options);
    FUZZ_CHECK(!program.empty(), "an accepted job compiles to an empty step");
    constexpr int64_t kStep = 7;
    v1::CommandBatch batch = MakeStepBatch(program, kStep, sync);
    absl::StatusOr<std::string> digest = BatchDigest(batch);
    FUZZ_CHECK(digest.ok(), digest.status().ToString());
    FUZZ_CHECK(*digest == ProgramDigest(program, kStep, sync),
               "a step batch's digest is not its program's");
    v1::CommandBatch received;
    FUZZ_CHECK(received.ParseFromString(CanonicalBytes(batch)), "a step batch does not parse");
    absl::StatusOr<StepProgram> converted =
        StepProgramFromProto(received.step().commands(), "step.commands");
    FUZZ_CHECK(converted.ok(), converted.status().ToString());
    FUZZ_CHECK(EncodeStepProgram(*converted) == EncodeStepProgram(program),
               "a compiled program changed on its way through the wire");
  }
}

void CheckPlan(const JobConfig& config) {
  absl::StatusOr<Plan> plan = ComputePlan(config.model, config.wrap_policy, config.world_size,
                                          config.sharding, config.optimizer);
  FUZZ_CHECK(plan.ok(), plan.status().ToString());
  const std::string json = PlanToJson(*plan, -1);
  FUZZ_CHECK(nlohmann::json::accept(json), "the plan's JSON does not parse");
}

}  // namespace

void CheckWireRoundTrip(const google::protobuf::Message& message) {
  const std::string bytes = CanonicalBytes(message);
  std::unique_ptr<google::protobuf::Message> copy(message.New());
  FUZZ_CHECK(copy->ParseFromString(bytes),
             absl::StrCat(message.GetTypeName(), " does not parse its own bytes"));
  FUZZ_CHECK(CanonicalBytes(*copy) == bytes,
             absl::StrCat(message.GetTypeName(), " re-serializes to different bytes"));
}

void CheckJsonRoundTrip(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;  // as ManifestToJson writes it
  std::string json;
  const auto printed = google::protobuf::util::MessageToJsonString(message, &json, print);
  FUZZ_CHECK(printed.ok(), printed.ToString());
  std::unique_ptr<google::protobuf::Message> copy(message.New());
  const auto parsed = google::protobuf::util::JsonStringToMessage(json, copy.get());
  FUZZ_CHECK(parsed.ok(), absl::StrCat(parsed.ToString(), " in ", json));
  CheckEquivalent(message, *copy, "through JSON");
}

void CheckEquivalent(const google::protobuf::Message& a, const google::protobuf::Message& b,
                     absl::string_view what) {
  // Equal values, not equal bytes: protobuf's JSON reads -0.0 back as 0 (an
  // unset field) and NaN != NaN; neither changes what a spec means.
  google::protobuf::util::DefaultFieldComparator comparator;
  comparator.set_treat_nan_as_equal(true);
  google::protobuf::util::MessageDifferencer differencer;
  differencer.set_field_comparator(&comparator);
  differencer.set_message_field_comparison(google::protobuf::util::MessageDifferencer::EQUIVALENT);
  std::string difference;
  differencer.ReportDifferencesToString(&difference);
  FUZZ_CHECK(differencer.Compare(a, b),
             absl::StrCat(a.GetTypeName(), " changed ", what, ": ", difference));
}

void CheckAcceptedModel(const ModelSpec& model) {
  const v1::ModelSpec proto = ModelSpecToProto(model);
  CheckWireRoundTrip(proto);
  CheckJsonRoundTrip(proto);
  absl::StatusOr<ModelSpec> back = ModelSpecFromProto(proto);
  FUZZ_CHECK(back.ok(),
             absl::StrCat("a valid model is refused in wire form: ", back.status().ToString()));
  FUZZ_CHECK(CanonicalBytes(ModelSpecToProto(*back)) == CanonicalBytes(proto),
             "the model's wire form is not a fixed point");
  absl::StatusOr<ModelIndex> index = IndexModel(model);
  FUZZ_CHECK(index.ok(), index.status().ToString());
  // FQNs name state-dict entries and checkpoint tensors: two of a kind would
  // silently share one.
  FUZZ_CHECK(index->param_by_fqn.size() == index->params.size(), "two parameters share an FQN");
  FUZZ_CHECK(index->module_by_fqn.size() == index->modules.size(), "two modules share an FQN");
  FUZZ_CHECK(index->modules.front().subtree_end == static_cast<int>(index->modules.size()),
             "the root's subtree is not the whole model");
  for (size_t p = 0; p < index->params.size(); ++p) {
    const int primary = index->params[p].primary;
    FUZZ_CHECK(primary <= static_cast<int>(p) &&
                   index->params[static_cast<size_t>(primary)].primary == primary,
               absl::StrCat(index->params[p].fqn, " has a primary that is not first or not one"));
  }
  const int64_t numel = index->TotalNumel();
  FUZZ_CHECK(numel > 0 && numel <= int64_t{1} << 44,
             absl::StrCat("the model has ", numel, " elements"));
  absl::StatusOr<std::vector<Unit>> units = ComputeUnits(*index, WrapPolicy{});
  FUZZ_CHECK(units.ok() && units->size() == 1 && units->front().numel == numel,
             "without a wrap policy a valid model is not one unit holding every element");
  WrapPolicy always;
  always.kind = WrapPolicy::Kind::kAlways;
  (void)ComputeUnits(*index, always);  // may refuse (ties across units); must not crash
}

void CheckAcceptedJob(const v1::JobSpec& spec, const JobConfig& config) {
  CheckAcceptedModel(config.model);
  absl::StatusOr<std::vector<Unit>> units = JobUnits(config);
  FUZZ_CHECK(units.ok(), units.status().ToString());
  CheckUnits(config, *units);
  CheckNormalizedSpec(spec, config, *units);
  CheckStepPrograms(config, *units);
  CheckPlan(config);
}

v1::JobSpec SampleJobSpec() {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(kSampleJobYaml, "sample-job.yaml", "");
  FUZZ_CHECK(spec.ok(), spec.status().ToString());
  return *std::move(spec);
}

}  // namespace flatshard::fuzz
