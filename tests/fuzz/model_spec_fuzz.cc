// Fuzz target for model specs in both forms: the model file (YAML or JSON in
// the file schema, core/model_spec_yaml.h, with its shorthands and `repeat`)
// and the protobuf JSON of flatshard.v1.ModelSpec converted by
// core/model_spec_proto.h, as a JobSpec carries it. Every input is tried as
// both.
//
// Asserts: a model either reader accepts is valid in the other sense too, has
// a stable wire form, indexes with unique FQNs and cuts into units
// (CheckAcceptedModel, job_checks.h). Seeds (corpus/model_spec): the examples'
// model files and a hand-written one using the explicit forms, plus their
// protobuf JSON, which `--write-seeds` derives.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "google/protobuf/util/json_util.h"

#include "core/model_spec.h"
#include "core/model_spec_proto.h"
#include "core/model_spec_yaml.h"
#include "tests/fuzz/fuzz_driver.h"
#include "tests/fuzz/job_checks.h"

namespace flatshard::fuzz {

bool FuzzOneInput(absl::string_view input) {
  bool accepted = false;
  absl::StatusOr<ModelSpec> from_file = ParseModelSpec(input, "fuzz.yaml");
  if (from_file.ok()) {
    CheckAcceptedModel(*from_file);
    accepted = true;
  }
  v1::ModelSpec wire;
  if (google::protobuf::util::JsonStringToMessage(std::string(input), &wire).ok()) {
    CheckWireRoundTrip(wire);
    absl::StatusOr<ModelSpec> from_wire = ModelSpecFromProto(wire);
    if (from_wire.ok()) {
      CheckAcceptedModel(*from_wire);
      accepted = true;
    }
  }
  return accepted;
}

std::vector<Seed> GeneratedSeeds(const std::vector<Seed>& corpus) {
  std::vector<Seed> seeds;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  for (const Seed& seed : corpus) {
    if (!absl::EndsWith(seed.name, ".yaml")) continue;
    absl::StatusOr<ModelSpec> model = ParseModelSpec(seed.bytes, seed.name);
    if (!model.ok()) continue;
    std::string json;
    if (!google::protobuf::util::MessageToJsonString(ModelSpecToProto(*model), &json, options)
             .ok()) {
      continue;
    }
    seeds.push_back({seed.name.substr(0, seed.name.size() - 5) + ".json", json});
  }
  return seeds;
}

}  // namespace flatshard::fuzz
