// Invariants the fuzz targets assert about what the code under test accepted.
// A model that passed validation must index, cut into units and survive its
// wire form unchanged. A job the coordinator's validation
// (JobConfigFromProto) accepts is one every later stage builds on without
// re-checking: its units, step programs and plan must exist, and its
// normalized wire form must validate to the same job on a worker.
#ifndef FLATSHARD_TESTS_FUZZ_JOB_CHECKS_H_
#define FLATSHARD_TESTS_FUZZ_JOB_CHECKS_H_

#include <string>

#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "rpc/command_batch.h"

#include "core/job_config.h"
#include "core/model_spec.h"
#include "flatshard/v1/job.pb.h"

namespace flatshard::fuzz {

// Aborts unless `message` reads back from its wire bytes and re-serializes to
// the same bytes: what the coordinator stores and digests must be stable.
void CheckWireRoundTrip(const google::protobuf::Message& message);

// Aborts unless `message`'s JSON form (checkpoint manifests embed the job spec
// so) reads back to an equivalent message.
void CheckJsonRoundTrip(const google::protobuf::Message& message);

// Aborts unless `a` and `b` hold the same values (unset and default alike,
// NaN equal to NaN); `what` says where `b` came from.
void CheckEquivalent(const google::protobuf::Message& a, const google::protobuf::Message& b,
                     absl::string_view what);

// Aborts unless a validated `model` indexes with unique FQNs, cuts into one
// unit without a wrap policy, and its wire form (ModelSpecToProto) converts
// back and forth to the same bytes, through JSON too.
void CheckAcceptedModel(const ModelSpec& model);

// Aborts unless `config` = JobConfigFromProto(`spec`) is self-consistent:
// - its units exist and hold every primary parameter exactly once;
// - the spec rebuilt from the config (model and wrap policy in their wire
//   forms) validates to the same model and units, as a worker receiving it in
//   a ConfigureRequest would;
// - the step programs compile, and a step batch's digest equals core's
//   ProgramDigest before and after the wire, as the worker's check needs;
// - the plan exists and its JSON (the Plan RPC's answer) is valid JSON.
void CheckAcceptedJob(const v1::JobSpec& spec, const JobConfig& config);

// A small valid job (examples/mlp-job.yaml with an inline, smaller model), for
// the seed writers.
v1::JobSpec SampleJobSpec();

}  // namespace flatshard::fuzz

#endif  // FLATSHARD_TESTS_FUZZ_JOB_CHECKS_H_
