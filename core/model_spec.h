// The model as flatshard sees it: a module tree with parameters, and tied
// (shared) parameters declared explicitly. FQNs follow PyTorch
// (`layers.3.mlp.fc1.weight`) so state dicts map one-to-one onto a PyTorch model.
// This file holds the types, validation and the flattened index; parsing from
// YAML/JSON and proto lives in model_spec_yaml.h and model_spec_proto.h.
#ifndef FLATSHARD_CORE_MODEL_SPEC_H_
#define FLATSHARD_CORE_MODEL_SPEC_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#include "core/dtype.h"

namespace flatshard {

struct ParamInit {
  enum class Kind { kDefault, kZeros, kOnes, kNormal, kUniform };
  Kind kind = Kind::kDefault;
  double mean = 0.0;
  double std = 0.0;
  double low = 0.0;
  double high = 0.0;
};

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::kFloat32;
  bool requires_grad = true;
  ParamInit init;
  int source_line = 0;  // 1-based line in the spec file; 0 when not from a file
};

struct ModuleSpec {
  std::string name;  // local name; empty for the root
  std::string type;
  std::vector<ParamSpec> params;
  std::vector<ModuleSpec> children;
  std::map<std::string, std::string> attrs;
  int source_line = 0;
};

struct TiedParam {
  std::string alias_fqn;
  std::string primary_fqn;
  int source_line = 0;
};

struct ModelSpec {
  std::string name;
  ModuleSpec root;
  std::vector<TiedParam> tied;
  std::string source;  // file the spec came from, for error messages; may be empty
};

int64_t NumElements(const std::vector<int64_t>& shape);

// "a.b" + "c" -> "a.b.c"; "" + "c" -> "c".
std::string JoinFqn(const std::string& prefix, const std::string& name);

// A module in pre-order (PyTorch's named_modules order).
struct IndexedModule {
  std::string fqn;  // "" for the root
  std::string type;
  int parent = -1;  // index into ModelIndex::modules
  int depth = 0;
  std::vector<int> children;
  std::vector<int> params;  // indices into ModelIndex::params, declaration order
  int subtree_end = 0;      // modules [this, subtree_end) form the subtree
};

// A parameter in traversal order: module pre-order, then the module's own
// parameters in declaration order (FSDP's flatten order, docs/fsdp-semantics.md §1.1).
struct IndexedParam {
  std::string fqn;
  int module = 0;
  const ParamSpec* spec = nullptr;
  // Index of the first parameter of its tie group in traversal order: FSDP's
  // "primary", whose storage the others alias. Equals its own index when untied.
  int primary = 0;
};

struct ModelIndex {
  std::vector<IndexedModule> modules;
  std::vector<IndexedParam> params;
  std::map<std::string, int> module_by_fqn;
  std::map<std::string, int> param_by_fqn;

  // Elements in the subtree of `module`, counting each tied group once, as
  // `sum(p.numel() for p in module.parameters())` does.
  int64_t SubtreeNumel(int module) const;
  int64_t TotalNumel() const { return SubtreeNumel(0); }
};

// Checks everything that can be checked without a wrap policy: names, types,
// shapes, dtypes, ties. Errors read "<source>:<line>: <where>: <problem>".
absl::Status ValidateModelSpec(const ModelSpec& spec);

// Validates, then builds the index. The index points into `spec`, which must
// outlive it.
absl::StatusOr<ModelIndex> IndexModel(const ModelSpec& spec);

// Formats an error location: "file.yaml:12: " (pieces omitted when unknown).
std::string SpecLocation(const ModelSpec& spec, int line);

}  // namespace flatshard

#endif  // FLATSHARD_CORE_MODEL_SPEC_H_
