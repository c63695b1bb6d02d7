// Turns a validated ModelSpec into the executable Layer tree: picks each module
// type's layer, finds its parameters in the ModelIndex, and checks the widths
// that flow between consecutive layers wherever the spec makes them knowable.
// Every error names the module's FQN and type. Used by Model::Create only.
#ifndef FLATSHARD_WORKER_COMPUTE_LAYER_BUILDER_H_
#define FLATSHARD_WORKER_COMPUTE_LAYER_BUILDER_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

#include "core/model_spec.h"
#include "worker/compute/layer.h"

namespace flatshard::compute {

struct LayerTree {
  std::unique_ptr<Layer> root;
  // True when the model reads Batch::ids: its first compute module (in
  // execution order, Identity/Dropout skipped) is an Embedding or a GPT.
  bool takes_token_ids = false;
  int64_t input_features = -1;   // width of Batch::inputs; -1 for token models or unknown
  int64_t vocab_size = 0;        // rows of the input embedding; 0 for dense models
  int64_t output_features = -1;  // width of the output; -1 when no layer fixes it
};

// `index` must be IndexModel(spec). Module types without compute
// (MultiheadAttention, ModuleDict) are UNIMPLEMENTED; bad structure, attributes
// or widths are INVALID_ARGUMENT.
absl::StatusOr<LayerTree> BuildLayerTree(const ModelSpec& spec, const ModelIndex& index);

}  // namespace flatshard::compute

#endif  // FLATSHARD_WORKER_COMPUTE_LAYER_BUILDER_H_
