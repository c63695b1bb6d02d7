// Reads a job file (YAML, or JSON which YAML reads; docs/job-spec.md) into the wire
// form flatshard.v1.JobSpec. This is syntax and typing only: unknown fields, wrong
// types and unknown enum names are INVALID_ARGUMENT naming `file:line: field`,
// while the meaning of the values (world size vs. hybrid groups, batch
// divisibility, lr >= 0, ...) is left to JobConfigFromProto (core/job_config.h),
// so a job sent over the wire and one read from a file are judged alike. Fields
// the file leaves out keep the proto defaults that job_config interprets; the one
// exception is the optimizer, whose torch.optim defaults (lr 1e-3, AdamW weight
// decay 0.01) the proto cannot express as zeros.
#ifndef FLATSHARD_CORE_JOB_SPEC_YAML_H_
#define FLATSHARD_CORE_JOB_SPEC_YAML_H_

#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "core/model_spec.h"
#include "flatshard/v1/job.pb.h"

namespace flatshard {

// Reads the model file a job names (`model: PATH`, PATH as written): from the
// disk (ParseJobSpec in storage/spec_files.h) or from what a client sent
// (ParseJobDocument).
using ModelFileLoader = absl::FunctionRef<absl::StatusOr<ModelSpec>(const std::string& path)>;

// `text` is the job document; `source` names it in errors (usually the file
// path). `model:` is either an inline model mapping (docs/model-spec.md) or the
// path of a model file, which `load_model` reads; its errors keep their code
// and are prefixed with the job's `source:line: model:`.
absl::StatusOr<v1::JobSpec> ParseJobSpecWith(absl::string_view text, const std::string& source,
                                             ModelFileLoader load_model);

// Parses a job document a client sent (JobDocument in job.proto) with the same
// reader: `model: PATH` is taken from document.files only, never from the disk
// of the process parsing it; a PATH not there is INVALID_ARGUMENT naming it.
absl::StatusOr<v1::JobSpec> ParseJobDocument(const v1::JobDocument& document);

// The spec a CreateJobRequest or PlanRequest carries: `spec` as sent (the C++
// CLI parses job files itself) or `document` parsed (the Python client); both
// at once is INVALID_ARGUMENT.
template <typename Request>
absl::StatusOr<v1::JobSpec> RequestedJobSpec(const Request& request) {
  if (!request.has_document()) return request.spec();
  if (request.has_spec()) {
    return absl::InvalidArgumentError("spec and document: send one of them, not both");
  }
  return ParseJobDocument(request.document());
}

}  // namespace flatshard

#endif  // FLATSHARD_CORE_JOB_SPEC_YAML_H_
