// The exact FSDP FlatParameter layout of one unit (docs/fsdp-semantics.md §1): the order and
// padding of the flat buffer, the shard size S = ceil(N/W), and each rank's
// _ShardParamInfo and FlatParamShardMetadata. Everything is integer arithmetic on
// element counts; no buffer is touched here (flat_buffer.h moves bytes).
#ifndef FLATSHARD_CORE_FLAT_PARAM_LAYOUT_H_
#define FLATSHARD_CORE_FLAT_PARAM_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

#include "core/dtype.h"

namespace flatshard {

// FSDP aligns each parameter to 16 bytes of the compute dtype (docs/fsdp-semantics.md §1.2).
inline constexpr int64_t kFlatParamAlignmentBytes = 16;
// Padding inside the flat buffer is filled with 42 (`_FLAT_PARAM_PADDING_VALUE`);
// shard right-padding (from _get_shard) is zero.
inline constexpr double kFlatParamPaddingValue = 42.0;

struct FlatParamEntry {
  std::string fqn;
  std::vector<int64_t> shape;
  DType dtype = DType::kFloat32;
  bool requires_grad = true;
};

struct FlatParamLayoutOptions {
  // Size of the group the unit is sharded over (the shard group under hybrid
  // strategies). Also the divisor of use_orig_params' world-size padding.
  int world_size = 1;
  // False for NO_SHARD: the flat parameter stays whole on every rank.
  bool sharded = true;
  bool use_orig_params = false;
  // Low-precision compute dtype when param mixed precision is on; its size sets
  // the alignment. Unset (= the params' dtype) when mixed precision is off.
  bool has_compute_dtype = false;
  DType compute_dtype = DType::kFloat32;
};

// Inclusive element interval [start, end] inside a flat buffer.
struct FlatRange {
  int64_t start = 0;
  int64_t end = -1;
  int64_t numel() const { return end - start + 1; }
};

// docs/fsdp-semantics.md §1.4.
struct ShardParamInfo {
  bool in_shard = false;
  int64_t offset_in_shard = 0;
  int64_t numel_in_shard = 0;
  int64_t intra_param_start_idx = 0;
  int64_t intra_param_end_idx = 0;
};

// One rank's view of the flat parameter.
struct ShardInfo {
  int rank = 0;
  FlatRange range;                     // [S*rank, S*(rank+1)-1]; may run into padding
  int64_t numel_padded = 0;            // _shard_numel_padded: zero right-padding
  std::vector<ShardParamInfo> params;  // one per original param (no padding)
};

// docs/fsdp-semantics.md §1.5: only in-shard params are listed.
struct FlatParamShardMetadata {
  std::vector<std::string> param_names;
  std::vector<std::vector<int64_t>> param_shapes;
  std::vector<std::vector<int64_t>> param_strides;
  std::vector<bool> param_contiguities;
  std::vector<int64_t> param_numels;
  std::vector<FlatRange> param_offsets;  // intra-param [start, end]
};

class FlatParamLayout {
 public:
  // Validates like _validate_tensors_to_flatten (docs/fsdp-semantics.md §1.1, §10): a
  // non-empty list, floating dtypes all equal, uniform requires_grad unless
  // use_orig_params. `unit_label` prefixes error messages.
  static absl::StatusOr<FlatParamLayout> Create(std::vector<FlatParamEntry> params,
                                                const FlatParamLayoutOptions& options,
                                                const std::string& unit_label);

  const std::vector<FlatParamEntry>& params() const { return params_; }
  const FlatParamLayoutOptions& options() const { return options_; }
  DType dtype() const { return params_.front().dtype; }
  int world_size() const { return options_.world_size; }
  int64_t aligned_numel() const { return aligned_numel_; }

  // _numels_with_padding and _is_padding_mask: one entry per param or padding.
  const std::vector<int64_t>& numels_with_padding() const { return numels_with_padding_; }
  const std::vector<bool>& is_padding_mask() const { return is_padding_mask_; }
  // Each param's interval inside the flat buffer (padding skipped).
  const std::vector<FlatRange>& param_ranges() const { return param_ranges_; }

  // N = _unpadded_unsharded_size: includes alignment and world-size padding in
  // use_orig_params mode.
  int64_t unpadded_unsharded_numel() const { return unpadded_unsharded_numel_; }
  // S: the length of every rank's shard (N when not sharded).
  int64_t sharded_numel() const { return sharded_numel_; }
  // S * W: the all-gather buffer (_padded_unsharded_size); N when not sharded.
  int64_t padded_unsharded_numel() const;
  // Elements that belong to params (N minus the padding inside the flat buffer).
  int64_t param_numel() const { return param_numel_; }

  // `rank` must be in [0, world_size). Not sharded: the whole range, no padding.
  ShardInfo ComputeShardInfo(int rank) const;
  FlatParamShardMetadata ComputeShardMetadata(int rank) const;

 private:
  FlatParamLayout() = default;

  std::vector<FlatParamEntry> params_;
  FlatParamLayoutOptions options_;
  int64_t aligned_numel_ = 0;
  std::vector<int64_t> numels_with_padding_;
  std::vector<bool> is_padding_mask_;
  std::vector<FlatRange> param_ranges_;
  int64_t unpadded_unsharded_numel_ = 0;
  int64_t sharded_numel_ = 0;
  int64_t param_numel_ = 0;
};

// torch.chunk(N, W) restated as integers (docs/fsdp-semantics.md §1.3): chunk size
// S = ceil(N/W), rank r holds [r*S, r*S + real_r) with real_r = clamp(N - r*S, 0, S)
// and needs S - real_r elements of right padding. Also dim-0 chunking of SHARDED
// state dicts.
struct ChunkSlice {
  int64_t begin = 0;    // first element (meaningless when length is 0)
  int64_t length = 0;   // real elements
  int64_t padding = 0;  // S - length
};
int64_t ChunkSize(int64_t numel, int world_size);
ChunkSlice ChunkOf(int64_t numel, int world_size, int rank);

// Row-major contiguous strides for a shape.
std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& shape);

}  // namespace flatshard

#endif  // FLATSHARD_CORE_FLAT_PARAM_LAYOUT_H_
