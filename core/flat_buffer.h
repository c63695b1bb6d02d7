// Moves bytes between original parameters, the flat buffer of a FlatParamLayout
// and per-rank shards: FSDP's flatten_tensors, _get_shard and the unflatten views
// (docs/fsdp-semantics.md §1.1–1.3), over plain byte spans so host and offline tools share
// them. Element type is the buffer's; sizes are checked, never assumed.
#ifndef FLATSHARD_CORE_FLAT_BUFFER_H_
#define FLATSHARD_CORE_FLAT_BUFFER_H_

#include <cstddef>
#include <span>
#include <vector>

#include "absl/status/status.h"

#include "core/dtype.h"
#include "core/flat_param_layout.h"

namespace flatshard {

// Writes each param into `flat` (N elements of `dtype`) at its range and fills
// the padding entries with 42. `params[i]` holds param i's elements.
absl::Status FlattenParams(const FlatParamLayout& layout, DType dtype,
                           const std::vector<std::span<const std::byte>>& params,
                           std::span<std::byte> flat);

// The inverse: copies each param's elements out of `flat` (N elements).
absl::Status UnflattenParams(const FlatParamLayout& layout, DType dtype,
                             std::span<const std::byte> flat,
                             const std::vector<std::span<std::byte>>& params);

// _get_shard: copies rank's chunk of `flat` (N elements) into `shard` (S
// elements) and zero-fills the right padding.
absl::Status CopyShard(const FlatParamLayout& layout, DType dtype, int rank,
                       std::span<const std::byte> flat, std::span<std::byte> shard);

// What an all-gather produces: rank r's shard at [r*S, (r+1)*S) of `unsharded`
// (S*W elements). Offline tools use it to consolidate shards.
absl::Status AssembleUnsharded(const FlatParamLayout& layout, DType dtype,
                               const std::vector<std::span<const std::byte>>& shards,
                               std::span<std::byte> unsharded);

}  // namespace flatshard

#endif  // FLATSHARD_CORE_FLAT_BUFFER_H_
