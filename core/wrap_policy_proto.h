// The wire form (flatshard.v1.WrapPolicy) of a WrapPolicy, for clients that build
// a JobSpec from the CLI syntax ("module-type:Residual"). The reverse conversion
// lives with the JobSpec validation in core/job_config.cc.
#ifndef FLATSHARD_CORE_WRAP_POLICY_PROTO_H_
#define FLATSHARD_CORE_WRAP_POLICY_PROTO_H_

#include "core/wrap_policy.h"
#include "flatshard/v1/common.pb.h"

namespace flatshard {

// kNone becomes an unset oneof, which job_config reads back as kNone. A size-based
// policy sends its leaf/exclude lists only when they differ from FSDP's defaults,
// so the defaults stay the receiver's to apply.
v1::WrapPolicy WrapPolicyToProto(const WrapPolicy& policy);

}  // namespace flatshard

#endif  // FLATSHARD_CORE_WRAP_POLICY_PROTO_H_
