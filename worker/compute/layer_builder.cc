#include "worker/compute/layer_builder.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "core/status_macros.h"
#include "worker/compute/activation.h"
#include "worker/compute/causal_self_attention.h"
#include "worker/compute/containers.h"
#include "worker/compute/embedding.h"
#include "worker/compute/gpt.h"
#include "worker/compute/layer_norm.h"
#include "worker/compute/linear.h"
#include "worker/compute/transformer_block.h"

namespace flatshard::compute {
namespace {

constexpr int64_t kUnknown = -1;  // a width no layer has fixed yet
using LayerPtr = std::unique_ptr<Layer>;

bool IsPassThrough(const std::string& type) { return type == "Identity" || type == "Dropout"; }

bool IsChain(const std::string& type) {
  return type == "Sequential" || type == "ModuleList" || type == "MLP" || type == "Module";
}

// The first module that computes, in execution order (children in spec order,
// pass-throughs skipped). An Embedding or GPT there makes a token model.
const ModuleSpec* FirstCompute(const ModuleSpec& module) {
  if (module.type == "GPT" || module.type == "Embedding") return &module;
  if (module.children.empty()) {
    // Identity, Dropout and empty containers pass their input through.
    return IsPassThrough(module.type) || IsChain(module.type) ? nullptr : &module;
  }
  for (const ModuleSpec& child : module.children) {
    if (const ModuleSpec* first = FirstCompute(child)) return first;
  }
  return nullptr;
}

size_t CountModules(const ModuleSpec& module) {
  size_t n = 1;
  for (const ModuleSpec& child : module.children) n += CountModules(child);
  return n;
}

class Builder {
 public:
  Builder(const ModelSpec& spec, const ModelIndex& index) : spec_(spec), index_(index) {}

  absl::StatusOr<LayerTree> Run() {
    if (index_.modules.size() != CountModules(spec_.root)) {
      return absl::InvalidArgumentError(
          absl::StrCat("model index has ", index_.modules.size(), " modules but the spec has ",
                       CountModules(spec_.root), "; build the index with IndexModel(spec)"));
    }
    const ModuleSpec* first = FirstCompute(spec_.root);
    ids_pending_ = first != nullptr && (first->type == "Embedding" || first->type == "GPT");
    tree_.takes_token_ids = ids_pending_;
    int64_t width = kUnknown;
    ASSIGN_OR_RETURN(tree_.root, Build(spec_.root, 0, width));
    tree_.output_features = width;
    return std::move(tree_);
  }

 private:
  // Builds module `m` (ModelIndex index `mi`). `width` is the number of columns
  // flowing in (kUnknown before the first layer fixes it) and becomes the
  // number flowing out.
  absl::StatusOr<LayerPtr> Build(const ModuleSpec& m, int mi, int64_t& width) {
    const std::string& type = m.type;
    if (type == "Linear") {
      ASSIGN_OR_RETURN(std::unique_ptr<LinearLayer> linear, BuildLinear(m, mi, width));
      return LayerPtr(std::move(linear));
    }
    if (type == "Embedding") {
      if (!ids_pending_) {
        return Error(m, mi,
                     "takes token ids, so it must be the model's first compute module (or "
                     "GPT's wte/wpe); here its input would be a float tensor");
      }
      ids_pending_ = false;
      ASSIGN_OR_RETURN(std::unique_ptr<EmbeddingLayer> embedding, BuildEmbedding(m, mi));
      tree_.vocab_size = embedding->num_embeddings();
      width = embedding->dim();
      return LayerPtr(std::move(embedding));
    }
    if (type == "LayerNorm") return BuildLayerNorm(m, mi, width);
    if (type == "ReLU") return LayerPtr(std::make_unique<ReluLayer>(Info(m, mi)));
    if (type == "GELU") return BuildGelu(m, mi);
    if (IsPassThrough(type)) return LayerPtr(std::make_unique<IdentityLayer>(Info(m, mi)));
    if (IsChain(type)) {
      ASSIGN_OR_RETURN(std::vector<LayerPtr> children, BuildChildren(m, mi, width));
      return LayerPtr(std::make_unique<SequentialLayer>(Info(m, mi), std::move(children)));
    }
    if (type == "Residual") return BuildResidual(m, mi, width);
    if (type == "TransformerBlock") return BuildTransformerBlock(m, mi, width);
    if (type == "CausalSelfAttention") return BuildAttention(m, mi, width);
    if (type == "GPT") return BuildGpt(m, mi, width);
    if (type == "ModuleDict") {
      return Unimplemented(m, mi,
                           "has no forward (as in PyTorch); use Sequential or ModuleList to run "
                           "children in order");
    }
    return Unimplemented(m, mi, "has no compute in the worker's layer library");
  }

  absl::StatusOr<std::unique_ptr<LinearLayer>> BuildLinear(const ModuleSpec& m, int mi,
                                                           int64_t& width) {
    ASSIGN_OR_RETURN(LayerParam weight, FindParam(m, mi, "weight", /*required=*/true));
    ASSIGN_OR_RETURN(LayerParam bias, FindParam(m, mi, "bias", /*required=*/false));
    const std::vector<int64_t>& shape = Shape(weight);  // [out, in]
    RETURN_IF_ERROR(ExpectWidth(m, mi, width, shape[1], "in_features"));
    width = shape[0];
    return std::make_unique<LinearLayer>(Info(m, mi), std::move(weight), std::move(bias), shape[1],
                                         shape[0]);
  }

  absl::StatusOr<std::unique_ptr<EmbeddingLayer>> BuildEmbedding(const ModuleSpec& m, int mi) {
    if (m.type != "Embedding") return Error(m, mi, "must be an Embedding");
    ASSIGN_OR_RETURN(LayerParam weight, FindParam(m, mi, "weight", /*required=*/true));
    const std::vector<int64_t> shape = Shape(weight);  // [num, dim]
    return std::make_unique<EmbeddingLayer>(Info(m, mi), std::move(weight), shape[0], shape[1]);
  }

  absl::StatusOr<LayerPtr> BuildLayerNorm(const ModuleSpec& m, int mi, int64_t& width) {
    ASSIGN_OR_RETURN(LayerParam weight, FindParam(m, mi, "weight", /*required=*/false));
    ASSIGN_OR_RETURN(LayerParam bias, FindParam(m, mi, "bias", /*required=*/false));
    // Without weight the width is attrs.normalized_shape (the shorthand
    // keeps it; CheckModuleAgainstType validated it) or, in a spec written
    // without it, whatever the layer's input has.
    int64_t dim = 0;
    if (weight.present()) {
      dim = Shape(weight)[0];
    } else if (auto it = m.attrs.find("normalized_shape"); it != m.attrs.end()) {
      if (!absl::SimpleAtoi(it->second, &dim) || dim <= 0) {
        return Error(
            m, mi,
            absl::StrCat("attrs.normalized_shape must be an integer > 0, got '", it->second, "'"));
      }
    }
    if (dim != 0) {
      RETURN_IF_ERROR(ExpectWidth(m, mi, width, dim, "normalized_shape"));
      width = dim;
    }
    double eps = LayerNormLayer::kDefaultEps;
    if (auto it = m.attrs.find("eps"); it != m.attrs.end()) {
      if (!absl::SimpleAtod(it->second, &eps) || !std::isfinite(eps) || eps < 0.0) {
        return Error(m, mi,
                     absl::StrCat("attrs.eps must be a number >= 0, got '", it->second, "'"));
      }
    }
    return LayerPtr(std::make_unique<LayerNormLayer>(Info(m, mi), std::move(weight),
                                                     std::move(bias), dim, eps));
  }

  absl::StatusOr<LayerPtr> BuildGelu(const ModuleSpec& m, int mi) {
    GeluLayer::Approximation approximate = GeluLayer::Approximation::kNone;
    if (auto it = m.attrs.find("approximate"); it != m.attrs.end()) {
      if (it->second == "tanh") {
        approximate = GeluLayer::Approximation::kTanh;
      } else if (it->second != "none") {
        return Error(
            m, mi,
            absl::StrCat("attrs.approximate must be 'none' or 'tanh', got '", it->second, "'"));
      }
    }
    return LayerPtr(std::make_unique<GeluLayer>(Info(m, mi), approximate));
  }

  absl::StatusOr<std::vector<LayerPtr>> BuildChildren(const ModuleSpec& m, int mi, int64_t& width) {
    std::vector<LayerPtr> children;
    for (size_t k = 0; k < m.children.size(); ++k) {
      ASSIGN_OR_RETURN(LayerPtr child, Build(m.children[k], ChildIndex(mi, k), width));
      children.push_back(std::move(child));
    }
    return children;
  }

  absl::StatusOr<LayerPtr> BuildResidual(const ModuleSpec& m, int mi, int64_t& width) {
    if (ids_pending_) {
      return Error(m, mi, "adds its input to its output, so it cannot take token ids");
    }
    int64_t in = width;
    ASSIGN_OR_RETURN(std::vector<LayerPtr> children, BuildChildren(m, mi, width));
    if (in == kUnknown) in = tree_.input_features;  // the residual is where the model starts
    if (in != kUnknown && width != kUnknown && in != width) {
      return Error(m, mi,
                   absl::StrCat("its children map width ", in, " to ", width,
                                "; the residual sum needs them equal"));
    }
    if (width == kUnknown) width = in;
    return LayerPtr(std::make_unique<ResidualLayer>(Info(m, mi), std::move(children)));
  }

  absl::StatusOr<LayerPtr> BuildTransformerBlock(const ModuleSpec& m, int mi, int64_t& width) {
    if (ids_pending_) {
      return Error(m, mi, "adds its input to its output, so it cannot take token ids");
    }
    ASSIGN_OR_RETURN(std::vector<size_t> at, NamedChildren(m, mi, {"ln_1", "attn", "ln_2", "mlp"}));
    const int64_t in = width;
    std::vector<LayerPtr> parts;
    for (size_t i = 0; i < at.size(); ++i) {
      ASSIGN_OR_RETURN(LayerPtr part, Build(m.children[at[i]], ChildIndex(mi, at[i]), width));
      parts.push_back(std::move(part));
      // After attn (i == 1) and mlp (i == 3) the residual sums need the input width.
      const int64_t model_in = in != kUnknown ? in : tree_.input_features;
      if ((i == 1 || i == 3) && width != kUnknown && model_in != kUnknown && width != model_in) {
        return Error(m, mi,
                     absl::StrCat("child '", m.children[at[i]].name, "' outputs width ", width,
                                  " but the residual stream is ", model_in));
      }
    }
    return LayerPtr(std::make_unique<TransformerBlockLayer>(
        Info(m, mi), std::move(parts[0]), std::move(parts[1]), std::move(parts[2]),
        std::move(parts[3])));
  }

  absl::StatusOr<LayerPtr> BuildAttention(const ModuleSpec& m, int mi, int64_t& width) {
    if (ids_pending_) return Error(m, mi, "cannot take token ids");
    ASSIGN_OR_RETURN(std::vector<size_t> at, NamedChildren(m, mi, {"c_attn", "c_proj"}));
    for (size_t k : at) {
      if (m.children[k].type != "Linear") {
        return Error(m, mi,
                     absl::StrCat("child '", m.children[k].name, "' must be a Linear, got ",
                                  m.children[k].type));
      }
    }
    int64_t heads = 0;
    auto it = m.attrs.find("num_heads");
    if (it == m.attrs.end() || !absl::SimpleAtoi(it->second, &heads) || heads <= 0) {
      return Error(m, mi,
                   absl::StrCat("attrs.num_heads must be a positive integer, got '",
                                it == m.attrs.end() ? "" : it->second, "'"));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<LinearLayer> c_attn,
                     BuildLinear(m.children[at[0]], ChildIndex(mi, at[0]), width));
    const int64_t qkv = c_attn->out_features();
    if (qkv % 3 != 0 || (qkv / 3) % heads != 0) {
      return Error(m, mi,
                   absl::StrCat("c_attn outputs ", qkv, " features; it must be 3 * C with C",
                                " divisible by num_heads ", heads));
    }
    width = qkv / 3;  // the attention output, c_proj's input
    ASSIGN_OR_RETURN(std::unique_ptr<LinearLayer> c_proj,
                     BuildLinear(m.children[at[1]], ChildIndex(mi, at[1]), width));
    return LayerPtr(std::make_unique<CausalSelfAttentionLayer>(Info(m, mi), std::move(c_attn),
                                                               std::move(c_proj), heads));
  }

  absl::StatusOr<LayerPtr> BuildGpt(const ModuleSpec& m, int mi, int64_t& width) {
    if (!ids_pending_) {
      return Error(m, mi, "takes token ids, so it must be the model's first compute module");
    }
    ids_pending_ = false;
    ASSIGN_OR_RETURN(std::vector<size_t> at,
                     NamedChildren(m, mi, {"wte", "wpe", "h", "ln_f", "lm_head"}));
    ASSIGN_OR_RETURN(std::unique_ptr<EmbeddingLayer> wte,
                     BuildEmbedding(m.children[at[0]], ChildIndex(mi, at[0])));
    ASSIGN_OR_RETURN(std::unique_ptr<EmbeddingLayer> wpe,
                     BuildEmbedding(m.children[at[1]], ChildIndex(mi, at[1])));
    if (wpe->dim() != wte->dim()) {
      return Error(m, mi, absl::StrCat("wpe has width ", wpe->dim(), " but wte has ", wte->dim()));
    }
    tree_.vocab_size = wte->num_embeddings();
    width = wte->dim();
    std::vector<LayerPtr> rest;
    for (size_t i = 2; i < at.size(); ++i) {
      ASSIGN_OR_RETURN(LayerPtr part, Build(m.children[at[i]], ChildIndex(mi, at[i]), width));
      rest.push_back(std::move(part));
    }
    return LayerPtr(std::make_unique<GptLayer>(Info(m, mi), std::move(wte), std::move(wpe),
                                               std::move(rest[0]), std::move(rest[1]),
                                               std::move(rest[2])));
  }

  // Positions in m.children of exactly the children `names`, in that order.
  absl::StatusOr<std::vector<size_t>> NamedChildren(const ModuleSpec& m, int mi,
                                                    const std::vector<std::string>& names) {
    std::vector<size_t> at;
    for (const std::string& name : names) {
      size_t k = 0;
      while (k < m.children.size() && m.children[k].name != name) ++k;
      if (k == m.children.size()) {
        return Error(m, mi,
                     absl::StrCat("needs a child named '", name,
                                  "' (children: ", absl::StrJoin(names, ", "), ")"));
      }
      at.push_back(k);
    }
    if (m.children.size() != names.size()) {
      return Error(m, mi,
                   absl::StrCat("has ", m.children.size(), " children; it runs exactly ",
                                absl::StrJoin(names, ", ")));
    }
    return at;
  }

  absl::StatusOr<LayerParam> FindParam(const ModuleSpec& m, int mi, const std::string& name,
                                       bool required) {
    for (int p : Indexed(mi).params) {
      const IndexedParam& param = index_.params[static_cast<size_t>(p)];
      if (param.spec->name != name) continue;
      if (!IsFloating(param.spec->dtype)) {
        return Error(
            m, mi,
            absl::StrCat("parameter '", param.fqn, "' has dtype ", DTypeName(param.spec->dtype),
                         "; layers compute in float32 and need a floating dtype"));
      }
      return LayerParam{p, param.fqn};
    }
    if (required) return Error(m, mi, absl::StrCat("needs a parameter named '", name, "'"));
    return LayerParam{};
  }

  // Checks that `width` flowing in matches what the layer expects; the first
  // layer to fix an unknown width fixes the model's input width.
  absl::Status ExpectWidth(const ModuleSpec& m, int mi, int64_t width, int64_t expected,
                           const char* what) {
    if (width == kUnknown) {
      if (!tree_.takes_token_ids && tree_.input_features == kUnknown) {
        tree_.input_features = expected;
      }
      return absl::OkStatus();
    }
    if (width != expected) {
      return Error(m, mi,
                   absl::StrCat("its input has width ", width, " but its ", what, " is ", expected,
                                " (shapes of consecutive layers must agree)"));
    }
    return absl::OkStatus();
  }

  const IndexedModule& Indexed(int mi) const { return index_.modules[static_cast<size_t>(mi)]; }
  int ChildIndex(int mi, size_t k) const { return Indexed(mi).children[k]; }
  const std::vector<int64_t>& Shape(const LayerParam& p) const {
    return index_.params[static_cast<size_t>(p.index)].spec->shape;
  }
  LayerInfo Info(const ModuleSpec& m, int mi) const { return {mi, Indexed(mi).fqn, m.type}; }

  std::string Label(const ModuleSpec& m, int mi) const {
    const std::string& fqn = Indexed(mi).fqn;
    return absl::StrCat(
        SpecLocation(spec_, m.source_line),
        fqn.empty() ? std::string("root module") : absl::StrCat("module '", fqn, "'"), " (", m.type,
        "): ");
  }
  absl::Status Error(const ModuleSpec& m, int mi, const std::string& problem) const {
    return absl::InvalidArgumentError(Label(m, mi) + problem);
  }
  absl::Status Unimplemented(const ModuleSpec& m, int mi, const std::string& problem) const {
    return absl::UnimplementedError(Label(m, mi) + problem);
  }

  const ModelSpec& spec_;
  const ModelIndex& index_;
  bool ids_pending_ = false;  // the model's token ids are still waiting for their Embedding
  LayerTree tree_;
};

}  // namespace

absl::StatusOr<LayerTree> BuildLayerTree(const ModelSpec& spec, const ModelIndex& index) {
  return Builder(spec, index).Run();
}

}  // namespace flatshard::compute
