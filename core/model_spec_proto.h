// Conversions between core's ModelSpec / DType and their wire forms in
// flatshard/v1/common.proto. FromProto validates, so a spec from the wire gets
// the same checks (and messages) as one from a file.
#ifndef FLATSHARD_CORE_MODEL_SPEC_PROTO_H_
#define FLATSHARD_CORE_MODEL_SPEC_PROTO_H_

#include "absl/status/statusor.h"

#include "core/dtype.h"
#include "core/model_spec.h"
#include "flatshard/v1/common.pb.h"

namespace flatshard {

v1::DType DTypeToProto(DType dtype);
// `field` names the proto field in the error (e.g. "model.root.params[0].dtype").
// DTYPE_UNSPECIFIED maps to `unset_value`.
absl::StatusOr<DType> DTypeFromProto(v1::DType dtype, DType unset_value, const std::string& field);

v1::ModelSpec ModelSpecToProto(const ModelSpec& spec);
absl::StatusOr<ModelSpec> ModelSpecFromProto(const v1::ModelSpec& proto);

}  // namespace flatshard

#endif  // FLATSHARD_CORE_MODEL_SPEC_PROTO_H_
