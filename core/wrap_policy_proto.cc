#include "core/wrap_policy_proto.h"

namespace flatshard {

v1::WrapPolicy WrapPolicyToProto(const WrapPolicy& policy) {
  v1::WrapPolicy proto;
  switch (policy.kind) {
    case WrapPolicy::Kind::kNone:
      break;
    case WrapPolicy::Kind::kModuleType:
      // Set the case even for an empty list so the receiver rejects it rather
      // than reading it as "none".
      proto.mutable_module_type();
      for (const std::string& type : policy.module_types) {
        proto.mutable_module_type()->add_module_types(type);
      }
      break;
    case WrapPolicy::Kind::kSizeBased: {
      v1::WrapPolicy::SizeBased* size = proto.mutable_size_based();
      size->set_min_num_params(policy.min_num_params);
      const WrapPolicy defaults;
      if (policy.force_leaf_module_types != defaults.force_leaf_module_types ||
          policy.exclude_module_types != defaults.exclude_module_types) {
        // Both lists travel as given: override_defaults keeps an empty one empty.
        size->set_override_defaults(true);
        for (const std::string& type : policy.force_leaf_module_types) {
          size->add_force_leaf_module_types(type);
        }
        for (const std::string& type : policy.exclude_module_types) {
          size->add_exclude_module_types(type);
        }
      }
      break;
    }
    case WrapPolicy::Kind::kExplicitFqns:
      proto.mutable_explicit_fqns();
      for (const std::string& fqn : policy.module_fqns) {
        proto.mutable_explicit_fqns()->add_module_fqns(fqn);
      }
      break;
    case WrapPolicy::Kind::kAlways:
      proto.mutable_always();
      break;
  }
  return proto;
}

}  // namespace flatshard
