#include "core/flat_buffer.h"

#include <cstring>

#include "absl/strings/str_cat.h"

#include "core/model_spec.h"

namespace flatshard {
namespace {

absl::Status CheckSize(absl::string_view what, size_t got, int64_t elements, size_t element_size) {
  const size_t want = static_cast<size_t>(elements) * element_size;
  if (got != want) {
    return absl::InvalidArgumentError(absl::StrCat(what, " has ", got, " bytes, expected ", want,
                                                   " (", elements, " elements of ", element_size,
                                                   " bytes)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status FlattenParams(const FlatParamLayout& layout, DType dtype,
                           const std::vector<std::span<const std::byte>>& params,
                           std::span<std::byte> flat) {
  const size_t es = DTypeSize(dtype);
  if (params.size() != layout.params().size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "got ", params.size(), " parameters, the layout has ", layout.params().size()));
  }
  if (absl::Status s = CheckSize("flat buffer", flat.size(), layout.unpadded_unsharded_numel(), es);
      !s.ok()) {
    return s;
  }
  size_t param = 0;
  int64_t offset = 0;
  for (size_t i = 0; i < layout.numels_with_padding().size(); ++i) {
    const int64_t numel = layout.numels_with_padding()[i];
    std::byte* dst = flat.data() + static_cast<size_t>(offset) * es;
    if (layout.is_padding_mask()[i]) {
      FillElements(dtype, kFlatParamPaddingValue, dst, static_cast<size_t>(numel));
    } else {
      if (absl::Status s = CheckSize(absl::StrCat("parameter '", layout.params()[param].fqn, "'"),
                                     params[param].size(), numel, es);
          !s.ok()) {
        return s;
      }
      std::memcpy(dst, params[param].data(), params[param].size());
      ++param;
    }
    offset += numel;
  }
  return absl::OkStatus();
}

absl::Status UnflattenParams(const FlatParamLayout& layout, DType dtype,
                             std::span<const std::byte> flat,
                             const std::vector<std::span<std::byte>>& params) {
  const size_t es = DTypeSize(dtype);
  if (params.size() != layout.params().size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "got ", params.size(), " parameters, the layout has ", layout.params().size()));
  }
  if (flat.size() < static_cast<size_t>(layout.unpadded_unsharded_numel()) * es) {
    return CheckSize("flat buffer", flat.size(), layout.unpadded_unsharded_numel(), es);
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const FlatRange& range = layout.param_ranges()[i];
    if (absl::Status s = CheckSize(absl::StrCat("parameter '", layout.params()[i].fqn, "'"),
                                   params[i].size(), range.numel(), es);
        !s.ok()) {
      return s;
    }
    std::memcpy(params[i].data(), flat.data() + static_cast<size_t>(range.start) * es,
                params[i].size());
  }
  return absl::OkStatus();
}

absl::Status CopyShard(const FlatParamLayout& layout, DType dtype, int rank,
                       std::span<const std::byte> flat, std::span<std::byte> shard) {
  const size_t es = DTypeSize(dtype);
  if (rank < 0 || rank >= layout.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside [0, ", layout.world_size(), ")"));
  }
  if (absl::Status s = CheckSize("flat buffer", flat.size(), layout.unpadded_unsharded_numel(), es);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckSize("shard", shard.size(), layout.sharded_numel(), es); !s.ok()) {
    return s;
  }
  const ChunkSlice chunk =
      layout.options().sharded
          ? ChunkOf(layout.unpadded_unsharded_numel(), layout.world_size(), rank)
          : ChunkSlice{0, layout.unpadded_unsharded_numel(), 0};
  const size_t real = static_cast<size_t>(chunk.length) * es;
  if (real > 0) {
    std::memcpy(shard.data(), flat.data() + static_cast<size_t>(chunk.begin) * es, real);
  }
  std::memset(shard.data() + real, 0, shard.size() - real);
  return absl::OkStatus();
}

absl::Status AssembleUnsharded(const FlatParamLayout& layout, DType dtype,
                               const std::vector<std::span<const std::byte>>& shards,
                               std::span<std::byte> unsharded) {
  const size_t es = DTypeSize(dtype);
  const int world = layout.options().sharded ? layout.world_size() : 1;
  if (shards.size() != static_cast<size_t>(world)) {
    return absl::InvalidArgumentError(
        absl::StrCat("got ", shards.size(), " shards, expected ", world));
  }
  if (absl::Status s =
          CheckSize("unsharded buffer", unsharded.size(), layout.padded_unsharded_numel(), es);
      !s.ok()) {
    return s;
  }
  const size_t shard_bytes = static_cast<size_t>(layout.sharded_numel()) * es;
  for (size_t r = 0; r < shards.size(); ++r) {
    if (absl::Status s = CheckSize(absl::StrCat("shard of rank ", r), shards[r].size(),
                                   layout.sharded_numel(), es);
        !s.ok()) {
      return s;
    }
    if (shard_bytes > 0) {
      std::memcpy(unsharded.data() + r * shard_bytes, shards[r].data(), shard_bytes);
    }
  }
  return absl::OkStatus();
}

}  // namespace flatshard
