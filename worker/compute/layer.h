// The base class of every executable module: runs the module's hooks around its
// own forward/backward work and gives layers one way to reach their parameters
// and to word errors. A Layer saves what its backward needs during forward; it
// never holds parameter pointers across calls (see param_resolver.h).
#ifndef FLATSHARD_WORKER_COMPUTE_LAYER_H_
#define FLATSHARD_WORKER_COMPUTE_LAYER_H_

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#include "worker/compute/module_hooks.h"
#include "worker/compute/param_resolver.h"
#include "worker/compute/tensor.h"

namespace flatshard::compute {

// Token ids an Embedding reads: on the device for the lookup, on the host to
// validate them first (a kernel cannot report an id out of range).
struct TokenIds {
  DeviceSpan<const int32_t> device;
  std::span<const int32_t> host;
};

// What one forward or backward pass hands down the layer tree.
struct RunContext {
  DeviceContext device;  // where tensors live and kernels run
  ParamResolver* params = nullptr;
  ModuleHooks* hooks = nullptr;
  // Tokens per sample: rows are [batch, seq_len] flattened. Attention needs it.
  int64_t seq_len = 1;
  // Token ids for an Embedding (the model's input ids, or GPT's positions).
  // Forward only: an Embedding copies the ids it needs for backward.
  const TokenIds* ids = nullptr;

  Stream& stream() const { return *device.stream; }
};

// Identifies a module in errors and hooks.
struct LayerInfo {
  int module_index = 0;  // ModelIndex pre-order index
  std::string fqn;       // "" for the root
  std::string type;
};

// A parameter a layer uses: its ModelIndex index and FQN (for errors).
struct LayerParam {
  int index = -1;  // -1: the module does not have this (optional) parameter
  std::string fqn;

  bool present() const { return index >= 0; }
};

class Layer {
 public:
  explicit Layer(LayerInfo info) : info_(std::move(info)) {}
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  // BeforeForward, the layer's work (children's Forward included), AfterForward.
  // `out` is overwritten.
  absl::Status Forward(const Tensor& in, Tensor& out, const RunContext& ctx);

  // BeforeBackward, the layer's backward (children included), AfterBackward.
  // `dout` is d(loss)/d(out) of the last Forward; `din` is overwritten with
  // d(loss)/d(in) (left empty by layers whose input is token ids).
  absl::Status Backward(const Tensor& dout, Tensor& din, const RunContext& ctx);

  const LayerInfo& info() const { return info_; }

 protected:
  virtual absl::Status DoForward(const Tensor& in, Tensor& out, const RunContext& ctx) = 0;
  virtual absl::Status DoBackward(const Tensor& dout, Tensor& din, const RunContext& ctx) = 0;

  // "module 'h.0.attn' (CausalSelfAttention): ", the prefix of every error.
  std::string Where() const;

  // Resolves `param`, failing when the resolver has no storage for it.
  absl::StatusOr<ParamSlot> Resolve(const RunContext& ctx, const LayerParam& param) const;

  // Resolve for an optional parameter: an empty slot when the module lacks it.
  absl::StatusOr<ParamSlot> ResolveOptional(const RunContext& ctx, const LayerParam& param) const;

  // INVALID_ARGUMENT unless `t` has `cols` columns; `what` names the tensor.
  absl::Status CheckCols(const Tensor& t, int64_t cols, const char* what) const;

 private:
  LayerInfo info_;
};

}  // namespace flatshard::compute

#endif  // FLATSHARD_WORKER_COMPUTE_LAYER_H_
