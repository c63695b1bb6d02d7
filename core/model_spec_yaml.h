// Reads a ModelSpec from the user-facing YAML (or JSON, which YAML parses) form
// documented in docs/model-spec.md. Strict: unknown fields, wrong types and bad
// values are errors that name the file, the line, the field and the problem.
#ifndef FLATSHARD_CORE_MODEL_SPEC_YAML_H_
#define FLATSHARD_CORE_MODEL_SPEC_YAML_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "core/model_spec.h"

namespace flatshard {

// `text` is a YAML or JSON document holding the model at top level or under a
// `model:` key. `source` names it in errors (usually the file path). The result
// is validated (ValidateModelSpec).
absl::StatusOr<ModelSpec> ParseModelSpec(absl::string_view text, const std::string& source);

}  // namespace flatshard

#endif  // FLATSHARD_CORE_MODEL_SPEC_YAML_H_
