// Fuzz target for job specs in both forms a job reaches flatshard in: the job
// file (YAML or JSON in the file schema, core/job_spec_yaml.h) and the
// protobuf JSON of flatshard.v1.JobSpec (JsonStringToMessage, the form
// checkpoint manifests embed). Every input is tried as both; whatever parses
// goes through the coordinator's validation (JobConfigFromProto).
//
// Asserts: a parsed spec survives the wire and its JSON form unchanged (a
// manifest must read back the spec it saved), and an accepted job is
// self-consistent (job_checks.h). Seeds (corpus/job_spec): hand-written job
// files derived from examples/mlp-job.yaml, and their protobuf JSON, which
// `--write-seeds` derives.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "google/protobuf/util/json_util.h"
#include "yaml-cpp/yaml.h"

#include "core/job_config.h"
#include "core/job_spec_yaml.h"
#include "core/yaml_fields.h"
#include "storage/spec_files.h"
#include "tests/fuzz/fuzz_driver.h"
#include "tests/fuzz/job_checks.h"

namespace flatshard::fuzz {
namespace {

// `model: PATH` makes ParseJobSpec read a file, and a fuzzer that can name
// /dev/zero or a FIFO would hang on its own input. The path form is the
// loader's (covered by job_spec_yaml_test); the fuzzer keeps to the text. The
// same yaml-cpp lookup as the reader's, so no spelling of the key slips by.
bool NamesModelFile(absl::string_view input) {
  absl::StatusOr<YAML::Node> document = ParseYamlDocument(input, "fuzz");
  if (!document.ok()) return false;  // ParseJobSpec refuses it before any read
  const YAML::Node& top = *document;
  return top.IsMap() && top["model"].IsDefined() && !top["model"].IsMap();
}

// Everything a parsed spec must satisfy; true when the job is accepted.
bool CheckSpec(const v1::JobSpec& spec) {
  CheckWireRoundTrip(spec);
  CheckJsonRoundTrip(spec);
  absl::StatusOr<JobConfig> config = JobConfigFromProto(spec);
  if (!config.ok()) return false;
  CheckAcceptedJob(spec, *config);
  return true;
}

}  // namespace

bool FuzzOneInput(absl::string_view input) {
  bool accepted = false;
  if (!NamesModelFile(input)) {
    absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(input, "fuzz.yaml", "");
    if (spec.ok()) accepted = CheckSpec(*spec);
  }
  v1::JobSpec wire;
  if (google::protobuf::util::JsonStringToMessage(std::string(input), &wire).ok()) {
    accepted = CheckSpec(wire) || accepted;
  }
  return accepted;
}

std::vector<Seed> GeneratedSeeds(const std::vector<Seed>& corpus) {
  std::vector<Seed> seeds;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  for (const Seed& seed : corpus) {
    if (!absl::EndsWith(seed.name, ".yaml")) continue;
    absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(seed.bytes, seed.name, "");
    if (!spec.ok() || !JobConfigFromProto(*spec).ok()) continue;
    std::string json;
    if (!google::protobuf::util::MessageToJsonString(*spec, &json, options).ok()) continue;
    seeds.push_back({seed.name.substr(0, seed.name.size() - 5) + ".json", json});
  }
  return seeds;
}

}  // namespace flatshard::fuzz
