#include "worker/runtime/flat_param_unit.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

#include "core/flat_buffer.h"
#include "core/status_macros.h"
#include "worker/comm/reduce_kernels.h"

namespace flatshard {
namespace {

size_t AsSize(int64_t n) { return static_cast<size_t>(n); }

}  // namespace

FlatParamUnit::FlatParamUnit(UnitRuntimeConfig config, Communicator* shard_comm,
                             Communicator* replicate_comm, MemoryTracker* memory)
    : config_(std::move(config)),
      shard_comm_(shard_comm),
      replicate_comm_(replicate_comm),
      memory_(memory),
      shard_(AsSize(config_.layout.sharded_numel()), DType::kFloat32, memory,
             config_.cpu_offload ? MemoryKind::kOffloadedParams : MemoryKind::kShardedParams) {}

absl::Status FlatParamUnit::ShardOf(std::span<const float> flat, std::span<float> shard) const {
  return CopyShard(layout(), DType::kFloat32, sharded() ? config_.shard_rank : 0,
                   std::as_bytes(flat), std::as_writable_bytes(shard));
}

int64_t FlatParamUnit::unsharded_bytes() const {
  return static_cast<int64_t>(gathered_.bytes() + compute_copy_.bytes());
}

absl::Status FlatParamUnit::Gather() {
  const DType param_dtype = config_.precision.param_dtype;
  const size_t n = AsSize(layout().unpadded_unsharded_numel());
  if (!sharded()) {
    // NO_SHARD: the shard is the whole parameter; with mixed precision the
    // compute copy carries the low-precision rounding (FSDP's _mp_shard).
    if (param_dtype == DType::kFloat32) {
      compute_view_ = shard_.as<float>();
      return absl::OkStatus();
    }
    HostBuffer low(n, param_dtype, memory_, MemoryKind::kLowPrecisionShard,
                   HostBuffer::Init::kUninitialized);
    ConvertElements(DType::kFloat32, shard_.data(), param_dtype, low.data(), n);
    compute_copy_ = HostBuffer(n, DType::kFloat32, memory_, MemoryKind::kUnshardedParams,
                               HostBuffer::Init::kUninitialized);
    ConvertElements(param_dtype, low.data(), DType::kFloat32, compute_copy_.data(), n);
    compute_view_ = compute_copy_.as<float>();
    return absl::OkStatus();
  }
  const size_t s = shard_.count();
  const size_t world = AsSize(config_.layout.world_size());
  HostBuffer low;
  const void* input = shard_.data();
  if (param_dtype != DType::kFloat32) {
    low = HostBuffer(s, param_dtype, memory_, MemoryKind::kLowPrecisionShard,
                     HostBuffer::Init::kUninitialized);
    ConvertElements(DType::kFloat32, shard_.data(), param_dtype, low.data(), s);
    input = low.data();
  }
  gathered_ = HostBuffer(s * world, param_dtype, memory_, MemoryKind::kUnshardedParams,
                         HostBuffer::Init::kUninitialized);
  RETURN_IF_ERROR(shard_comm_->AllGather(input, gathered_.data(), s, param_dtype));
  low.Release();  // post_unshard frees the low-precision shard
  if (param_dtype == DType::kFloat32) {
    compute_view_ = gathered_.as<float>();
  } else {
    compute_copy_ = HostBuffer(n, DType::kFloat32, memory_, MemoryKind::kUnshardedParams,
                               HostBuffer::Init::kUninitialized);
    ConvertElements(param_dtype, gathered_.data(), DType::kFloat32, compute_copy_.data(), n);
    compute_view_ = compute_copy_.as<float>();
  }
  return absl::OkStatus();
}

void FlatParamUnit::Free() {
  compute_view_ = nullptr;
  compute_copy_.Release();
  gathered_.Release();
}

float* FlatParamUnit::EnsureGrad() {
  if (!unsharded_grad_.allocated()) {
    unsharded_grad_ = HostBuffer(AsSize(layout().unpadded_unsharded_numel()), DType::kFloat32,
                                 memory_, MemoryKind::kGradients);
  }
  return unsharded_grad_.as<float>();
}

absl::Status FlatParamUnit::ReduceGrad() {
  // A unit that got no gradient this step still takes part, with zeros, so the
  // ranks' collectives stay matched.
  EnsureGrad();
  const DType reduce_dtype = config_.precision.reduce_dtype;
  const size_t n = AsSize(layout().unpadded_unsharded_numel());
  const size_t s = shard_.count();
  const size_t world = sharded() ? AsSize(layout().world_size()) : 1;
  // docs/fsdp-semantics.md §3.2: pad to S*W in the reduce dtype (zeros past N), divide by pre.
  HostBuffer padded(s * world, reduce_dtype, memory_, MemoryKind::kGradients,
                    HostBuffer::Init::kUninitialized);
  ConvertElements(DType::kFloat32, unsharded_grad_.data(), reduce_dtype, padded.data(), n);
  const size_t es = DTypeSize(reduce_dtype);
  std::memset(padded.data() + n * es, 0, (s * world - n) * es);
  unsharded_grad_.Release();
  if (config_.divide.pre > 1) {
    DivideElements(reduce_dtype, padded.data(), s * world, config_.divide.pre);
  }
  HostBuffer reduced;
  if (sharded()) {
    reduced = HostBuffer(s, reduce_dtype, memory_, MemoryKind::kGradients,
                         HostBuffer::Init::kUninitialized);
    RETURN_IF_ERROR(shard_comm_->ReduceScatter(padded.data(), reduced.data(), s, reduce_dtype));
    padded.Release();
    if (replicate_comm_ != nullptr) {
      RETURN_IF_ERROR(replicate_comm_->AllReduce(reduced.data(), s, reduce_dtype, ReduceOp::kSum));
    }
  } else {
    // docs/fsdp-semantics.md §3.3: NO_SHARD all-reduces the whole gradient in place.
    RETURN_IF_ERROR(shard_comm_->AllReduce(padded.data(), s, reduce_dtype, ReduceOp::kSum));
    reduced = std::move(padded);
  }
  if (config_.divide.post > 1) DivideElements(reduce_dtype, reduced.data(), s, config_.divide.post);
  // _accumulate_sharded_grad: cast to the parameter's dtype and add.
  if (!grad_shard_.allocated()) {
    grad_shard_ = HostBuffer(s, DType::kFloat32, memory_, MemoryKind::kGradients);
  }
  if (reduce_dtype == DType::kFloat32) {
    float* acc = grad_shard_.as<float>();
    const float* add = reduced.as<float>();
    for (size_t i = 0; i < s; ++i) acc[i] += add[i];
  } else {
    std::vector<float> widened(s);
    ConvertElements(reduce_dtype, reduced.data(), DType::kFloat32,
                    reinterpret_cast<std::byte*>(widened.data()), s);
    float* acc = grad_shard_.as<float>();
    for (size_t i = 0; i < s; ++i) acc[i] += widened[i];
  }
  return absl::OkStatus();
}

absl::Status FlatParamUnit::GatherGradFullPrecision(std::vector<float>& out) {
  // All ranks agree on whether any gradient exists before gathering.
  int32_t missing = grad_shard_.allocated() ? 0 : 1;
  if (sharded()) {
    RETURN_IF_ERROR(shard_comm_->AllReduce(&missing, 1, DType::kInt32, ReduceOp::kSum));
  }
  const int world = sharded() ? layout().world_size() : 1;
  out.clear();
  if (missing == world) return absl::OkStatus();
  const size_t s = shard_.count();
  std::vector<float> local(s, 0.0f);
  if (grad_shard_.allocated()) std::copy_n(grad_shard_.as<float>(), s, local.begin());
  if (!sharded()) {
    out = std::move(local);
    return absl::OkStatus();
  }
  out.resize(s * static_cast<size_t>(world));
  RETURN_IF_ERROR(shard_comm_->AllGather(local.data(), out.data(), s, DType::kFloat32));
  out.resize(AsSize(layout().unpadded_unsharded_numel()));
  return absl::OkStatus();
}

absl::Status FlatParamUnit::GatherShardValues(std::span<const float> values,
                                              std::vector<float>& out) {
  const size_t n = AsSize(layout().unpadded_unsharded_numel());
  const size_t s = shard_.count();
  if (values.size() != s) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard values hold ", values.size(), " elements, the shard ", s));
  }
  if (!sharded()) {
    out.assign(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(n));
    return absl::OkStatus();
  }
  std::vector<float> all(s * AsSize(layout().world_size()));
  RETURN_IF_ERROR(shard_comm_->AllGather(values.data(), all.data(), s, DType::kFloat32));
  all.resize(n);
  out = std::move(all);
  return absl::OkStatus();
}

}  // namespace flatshard
