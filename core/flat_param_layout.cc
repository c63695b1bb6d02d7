#include "core/flat_param_layout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

#include "core/model_spec.h"

namespace flatshard {

int64_t ChunkSize(int64_t numel, int world_size) {
  return numel == 0 ? 0 : (numel + world_size - 1) / world_size;
}

ChunkSlice ChunkOf(int64_t numel, int world_size, int rank) {
  const int64_t s = ChunkSize(numel, world_size);
  const int64_t begin = std::min(numel, s * rank);
  const int64_t length = std::clamp<int64_t>(numel - s * rank, 0, s);
  return ChunkSlice{begin, length, s - length};
}

std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t i = shape.size(); i > 1; --i) strides[i - 2] = strides[i - 1] * shape[i - 1];
  return strides;
}

absl::StatusOr<FlatParamLayout> FlatParamLayout::Create(std::vector<FlatParamEntry> params,
                                                        const FlatParamLayoutOptions& options,
                                                        const std::string& unit_label) {
  auto error = [&](const std::string& problem) {
    return absl::InvalidArgumentError(absl::StrCat(unit_label, ": ", problem));
  };
  if (params.empty()) {
    return error("Cannot construct a FlatParamHandle with an empty parameter list");
  }
  if (options.world_size < 1) {
    return error(absl::StrCat("world_size must be >= 1, got ", options.world_size));
  }
  const FlatParamEntry& first = params.front();
  for (const FlatParamEntry& param : params) {
    if (!IsFloating(param.dtype)) {
      return error(absl::StrCat("parameter '", param.fqn, "' has dtype ", DTypeName(param.dtype),
                                "; only floating dtypes can be sharded"));
    }
    if (param.dtype != first.dtype) {
      return error(
          absl::StrCat("parameter '", param.fqn, "' has dtype ", DTypeName(param.dtype), " but '",
                       first.fqn, "' has ", DTypeName(first.dtype),
                       "; a unit's parameters must share one dtype (wrap them in separate units)"));
    }
    if (!options.use_orig_params && param.requires_grad != first.requires_grad) {
      return error(
          absl::StrCat("parameters '", first.fqn, "' and '", param.fqn,
                       "' differ in requires_grad; a unit mixes frozen and trainable parameters "
                       "only with use_orig_params"));
    }
    if (NumElements(param.shape) <= 0) {
      return error(absl::StrCat("parameter '", param.fqn, "' has no elements"));
    }
  }

  FlatParamLayout layout;
  layout.options_ = options;
  const DType align_dtype = options.has_compute_dtype ? options.compute_dtype : first.dtype;
  layout.aligned_numel_ = options.use_orig_params ? kFlatParamAlignmentBytes /
                                                        static_cast<int64_t>(DTypeSize(align_dtype))
                                                  : 0;
  auto add_padding = [&](int64_t numel) {
    layout.numels_with_padding_.push_back(numel);
    layout.is_padding_mask_.push_back(true);
  };
  int64_t total = 0;
  for (const FlatParamEntry& param : params) {
    if (layout.aligned_numel_ > 0) {
      // docs/fsdp-semantics.md §1.2: padding only when 0 < pad < aligned_numel, so never
      // before the first param.
      const int64_t pad = layout.aligned_numel_ - total % layout.aligned_numel_;
      if (pad > 0 && pad < layout.aligned_numel_) {
        add_padding(pad);
        total += pad;
      }
    }
    const int64_t numel = NumElements(param.shape);
    layout.numels_with_padding_.push_back(numel);
    layout.is_padding_mask_.push_back(false);
    layout.param_ranges_.push_back(FlatRange{total, total + numel - 1});
    layout.param_numel_ += numel;
    total += numel;
  }
  if (layout.aligned_numel_ > 0) {
    // "to avoid a copy for the post-backward reduce-scatter" (docs/fsdp-semantics.md §1.2).
    const int64_t pad = options.world_size - total % options.world_size;
    if (pad > 0 && pad < options.world_size) {
      add_padding(pad);
      total += pad;
    }
  }
  layout.unpadded_unsharded_numel_ = total;
  layout.sharded_numel_ = options.sharded ? ChunkSize(total, options.world_size) : total;
  layout.params_ = std::move(params);
  return layout;
}

int64_t FlatParamLayout::padded_unsharded_numel() const {
  return options_.sharded ? sharded_numel_ * options_.world_size : unpadded_unsharded_numel_;
}

ShardInfo FlatParamLayout::ComputeShardInfo(int rank) const {
  ShardInfo info;
  info.rank = rank;
  if (options_.sharded) {
    const int64_t s = sharded_numel_;
    info.range = FlatRange{s * rank, s * (rank + 1) - 1};
    info.numel_padded = ChunkOf(unpadded_unsharded_numel_, options_.world_size, rank).padding;
  } else {
    info.range = FlatRange{0, unpadded_unsharded_numel_ - 1};
    info.numel_padded = 0;
  }
  const int64_t start = info.range.start;
  const int64_t end = info.range.end;
  info.params.reserve(param_ranges_.size());
  for (const FlatRange& param : param_ranges_) {
    ShardParamInfo p;
    p.in_shard = start <= param.end && end >= param.start;
    if (p.in_shard) {
      if (start <= param.start) {
        p.intra_param_start_idx = 0;
        p.offset_in_shard = param.start - start;
      } else {
        p.intra_param_start_idx = start - param.start;
        p.offset_in_shard = 0;
      }
      p.intra_param_end_idx = std::min(param.end, end) - param.start;
      p.numel_in_shard = p.intra_param_end_idx - p.intra_param_start_idx + 1;
    }
    info.params.push_back(p);
  }
  return info;
}

FlatParamShardMetadata FlatParamLayout::ComputeShardMetadata(int rank) const {
  const ShardInfo info = ComputeShardInfo(rank);
  FlatParamShardMetadata metadata;
  for (size_t i = 0; i < params_.size(); ++i) {
    const ShardParamInfo& p = info.params[i];
    if (!p.in_shard) continue;
    metadata.param_names.push_back(params_[i].fqn);
    metadata.param_shapes.push_back(params_[i].shape);
    metadata.param_strides.push_back(ContiguousStrides(params_[i].shape));
    metadata.param_contiguities.push_back(true);
    metadata.param_numels.push_back(NumElements(params_[i].shape));
    metadata.param_offsets.push_back(FlatRange{p.intra_param_start_idx, p.intra_param_end_idx});
  }
  return metadata;
}

}  // namespace flatshard
