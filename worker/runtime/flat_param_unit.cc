#include "worker/runtime/flat_param_unit.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

#include "core/flat_buffer.h"
#include "core/status_macros.h"

namespace flatshard {
namespace {

size_t AsSize(int64_t n) { return static_cast<size_t>(n); }

DeviceSpan<const std::byte> Bytes(const DeviceBuffer& buffer) { return buffer.byte_span(); }

}  // namespace

absl::StatusOr<std::unique_ptr<FlatParamUnit>> FlatParamUnit::Create(
    UnitRuntimeConfig config, const UnitPlacement& placement) {
  std::unique_ptr<FlatParamUnit> unit(new FlatParamUnit(std::move(config), placement));
  const size_t s = AsSize(unit->layout().sharded_numel());
  ASSIGN_OR_RETURN(unit->shard_,
                   unit->Allocate(s * sizeof(float), *placement.compute,
                                  unit->config_.cpu_offload ? MemoryKind::kOffloadedParams
                                                            : MemoryKind::kShardedParams));
  RETURN_IF_ERROR(placement.compute->Zero(unit->shard_.byte_span()));
  return unit;
}

absl::StatusOr<DeviceBuffer> FlatParamUnit::Allocate(size_t bytes, Stream& stream,
                                                     MemoryKind kind) const {
  return p_.device->Allocate(bytes, stream, kind, p_.memory);
}

int64_t FlatParamUnit::unsharded_bytes() const {
  return static_cast<int64_t>(gathered_.bytes() + compute_copy_.bytes());
}

absl::Status FlatParamUnit::Gather() {
  Stream& comm = *p_.comm;
  const DType param_dtype = config_.precision.param_dtype;
  const size_t es = DTypeSize(param_dtype);
  const size_t n = AsSize(layout().unpadded_unsharded_numel());
  if (!sharded()) {
    // NO_SHARD: the shard is the whole parameter; with mixed precision the
    // compute copy carries the low-precision rounding (FSDP's _mp_shard).
    if (param_dtype == DType::kFloat32) {
      compute_view_ = shard_.span<float>().first(n);
    } else {
      ASSIGN_OR_RETURN(DeviceBuffer low, Allocate(n * es, comm, MemoryKind::kLowPrecisionShard));
      RETURN_IF_ERROR(comm.Cast(DType::kFloat32, Bytes(shard_), param_dtype, low.byte_span(), n));
      ASSIGN_OR_RETURN(compute_copy_,
                       Allocate(n * sizeof(float), comm, MemoryKind::kUnshardedParams));
      RETURN_IF_ERROR(
          comm.Cast(param_dtype, Bytes(low), DType::kFloat32, compute_copy_.byte_span(), n));
      low.Release(comm);
      compute_view_ = compute_copy_.span<float>().first(n);
    }
    ASSIGN_OR_RETURN(gathered_event_, comm.Record());
    return absl::OkStatus();
  }
  const size_t s = shard_.bytes() / sizeof(float);
  const size_t world = AsSize(layout().world_size());
  DeviceBuffer low;
  DeviceSpan<const std::byte> input = Bytes(shard_);
  if (param_dtype != DType::kFloat32) {
    ASSIGN_OR_RETURN(low, Allocate(s * es, comm, MemoryKind::kLowPrecisionShard));
    RETURN_IF_ERROR(comm.Cast(DType::kFloat32, Bytes(shard_), param_dtype, low.byte_span(), s));
    input = Bytes(low);
  }
  ASSIGN_OR_RETURN(gathered_, Allocate(s * world * es, comm, MemoryKind::kUnshardedParams));
  RETURN_IF_ERROR(p_.shard->AllGather(comm, input, gathered_.byte_span(), s, param_dtype));
  low.Release(comm);  // post_unshard frees the low-precision shard
  if (param_dtype == DType::kFloat32) {
    compute_view_ = gathered_.span<float>().first(n);
  } else {
    ASSIGN_OR_RETURN(compute_copy_,
                     Allocate(n * sizeof(float), comm, MemoryKind::kUnshardedParams));
    RETURN_IF_ERROR(
        comm.Cast(param_dtype, Bytes(gathered_), DType::kFloat32, compute_copy_.byte_span(), n));
    compute_view_ = compute_copy_.span<float>().first(n);
    // The kernels compute on the fp32 copy (holding the low-precision
    // values exactly), so nothing reads the low-precision gather after the
    // cast: free it now rather than at Reshard, S*W*es less per live unit.
    gathered_.Release(comm);
  }
  ASSIGN_OR_RETURN(gathered_event_, comm.Record());
  return absl::OkStatus();
}

void FlatParamUnit::Free() {
  compute_view_ = {};
  compute_copy_.Release(*p_.compute);
  gathered_.Release(*p_.compute);
}

size_t FlatParamUnit::GradCapacity() const {
  // Sharded units hold the gradient padded to S*W (zeros past N), so a
  // float32 reduction can run in place on it (ReduceGrad).
  return sharded() ? (shard_.bytes() / sizeof(float)) * AsSize(layout().world_size())
                   : AsSize(layout().unpadded_unsharded_numel());
}

absl::StatusOr<DeviceSpan<float>> FlatParamUnit::EnsureGrad() {
  if (!unsharded_grad_.allocated()) {
    ASSIGN_OR_RETURN(unsharded_grad_,
                     Allocate(GradCapacity() * sizeof(float), *p_.compute, MemoryKind::kGradients));
    RETURN_IF_ERROR(p_.compute->Zero(unsharded_grad_.byte_span()));
  }
  return grad();
}

DeviceSpan<float> FlatParamUnit::grad() const {
  if (!unsharded_grad_.allocated()) return {};
  return unsharded_grad_.span<float>().first(AsSize(layout().unpadded_unsharded_numel()));
}

absl::Status FlatParamUnit::ReduceGrad() {
  if (!unsharded_grad_.allocated()) {
    return absl::FailedPreconditionError(absl::StrCat(
        UnitLabel(config_.unit), ": ReduceGrad without a gradient (EnsureGrad first)"));
  }
  Stream& comm = *p_.comm;
  const DType reduce_dtype = config_.precision.reduce_dtype;
  const size_t es = DTypeSize(reduce_dtype);
  const size_t s = shard_.bytes() / sizeof(float);
  const size_t world = sharded() ? AsSize(layout().world_size()) : 1;
  const bool first_grad = !grad_shard_.allocated();
  if (first_grad) {
    ASSIGN_OR_RETURN(grad_shard_, Allocate(s * sizeof(float), comm, MemoryKind::kGradients));
  }
  // docs/fsdp-semantics.md §3.2: pad to S*W in the reduce dtype (zeros past N),
  // divide by pre, reduce, divide by post, cast to the parameter's dtype and
  // add (_accumulate_sharded_grad).
  // In float32 the S*W buffer is the gradient itself, held padded with zeros
  // (GradCapacity), which the reduction is the last reader of: no second
  // unit-sized buffer, and each element is read and written back in the same
  // cache line. Other reduce dtypes fill a separate buffer.
  const DeviceSpan<const float> grad_in = grad();
  DeviceBuffer padded;
  DeviceSpan<std::byte> work = unsharded_grad_.byte_span();
  if (reduce_dtype != DType::kFloat32 || work.size() != s * world * es) {
    ASSIGN_OR_RETURN(padded, Allocate(s * world * es, comm, MemoryKind::kGradients));
    work = padded.byte_span();
  }
  auto release = [&] {
    unsharded_grad_.Release(comm);
    padded.Release(comm);
  };
  if (sharded() && p_.replicate == nullptr) {
    // One collective: the host ring folds the element passes into its own
    // reads (HostCollectives::ReduceGradient) and reduce-scatters in place
    // on the work buffer (scratch after this) either way. A first gradient
    // is written, not added to zeros.
    RETURN_IF_ERROR(p_.shard->ReduceGradient(
        comm, GradientReduction{grad_in, reduce_dtype, config_.divide.pre, config_.divide.post,
                                work, s, grad_shard_.span<float>(), !first_grad}));
    release();
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(
      comm.PrepareGradForReduce(grad_in, reduce_dtype, work, s * world, config_.divide.pre));
  // The reduced shard: this rank's chunk of the work buffer.
  DeviceSpan<std::byte> reduced = work.first(s * es);
  if (sharded()) {
    // HYBRID_SHARD: reduce-scatter in place within the shard group, then
    // all-reduce the shard across the replicas.
    RETURN_IF_ERROR(p_.shard->ReduceScatterInPlace(comm, work, s, reduce_dtype));
    reduced = work.subspan(s * es * AsSize(p_.shard->rank()), s * es);
    RETURN_IF_ERROR(p_.replicate->AllReduce(comm, reduced, s, reduce_dtype, ReduceOp::kSum));
  } else {
    // §3.3: NO_SHARD all-reduces the whole gradient in place.
    RETURN_IF_ERROR(p_.shard->AllReduce(comm, work, s, reduce_dtype, ReduceOp::kSum));
  }
  if (first_grad) RETURN_IF_ERROR(comm.Zero(grad_shard_.byte_span()));
  RETURN_IF_ERROR(comm.AccumulateReducedGrad(reduce_dtype, reduced, grad_shard_.span<float>(),
                                             config_.divide.post));
  release();
  return absl::OkStatus();
}

void FlatParamUnit::ClearGradShard() { grad_shard_.Release(*p_.compute); }

absl::StatusOr<PinnedBuffer> FlatParamUnit::CopyToPinned(DeviceSpan<const float> values,
                                                         Stream& stream) const {
  ASSIGN_OR_RETURN(PinnedBuffer pinned, p_.device->AllocatePinned(values.size_bytes()));
  RETURN_IF_ERROR(stream.CopyToHost(pinned.copy_target(), AsBytes(values)));
  return pinned;
}

absl::StatusOr<std::vector<float>> FlatParamUnit::ReadToHost(DeviceSpan<const float> values) const {
  ASSIGN_OR_RETURN(PinnedBuffer staging, CopyToPinned(values, *p_.compute));
  RETURN_IF_ERROR(p_.compute->Synchronize());
  ASSIGN_OR_RETURN(std::span<const float> host, std::as_const(staging).Read<float>());
  return std::vector<float>(host.begin(),
                            host.begin() + static_cast<std::ptrdiff_t>(values.size()));
}

absl::StatusOr<std::vector<float>> FlatParamUnit::ReadShard() const {
  return ReadToHost(shard_.span<const float>());
}

absl::StatusOr<PinnedBuffer> FlatParamUnit::CopyShardToPinned(Stream& stream) const {
  return CopyToPinned(shard_.span<const float>(), stream);
}

absl::StatusOr<std::vector<float>> FlatParamUnit::ReadGradShard() const {
  if (!grad_shard_.allocated()) return std::vector<float>();
  return ReadToHost(grad_shard_.span<const float>());
}

absl::Status FlatParamUnit::WriteShard(std::span<const float> values) {
  const size_t s = shard_.bytes() / sizeof(float);
  if (values.size() != s) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard values hold ", values.size(), " elements, the shard ", s));
  }
  // Straight from the caller's memory: a copy from memory that is not pinned
  // is done when the call returns (stream.h), so no pinned staging buffer and
  // no second pass over the values (a checkpoint load applies a whole shard).
  RETURN_IF_ERROR(p_.compute->CopyToDevice(shard_.byte_span(), std::as_bytes(values)));
  return p_.compute->Synchronize();
}

absl::Status FlatParamUnit::ReplaceShard(StagedFloats values) {
  return std::move(values).MoveInto(shard_, *p_.compute);
}

absl::Status FlatParamUnit::ShardOf(std::span<const float> flat, std::span<float> shard) const {
  return CopyShard(layout(), DType::kFloat32, sharded() ? config_.shard_rank : 0,
                   std::as_bytes(flat), std::as_writable_bytes(shard));
}

absl::Status FlatParamUnit::LoadFull(std::span<const float> flat) {
  std::vector<float> shard(shard_.bytes() / sizeof(float));
  RETURN_IF_ERROR(ShardOf(flat, shard));
  return WriteShard(shard);
}

absl::Status FlatParamUnit::GatherFullPrecision(std::vector<float>& out) const {
  ASSIGN_OR_RETURN(std::vector<float> shard, ReadShard());
  return GatherShardValues(shard, out);
}

absl::Status FlatParamUnit::GatherGradFullPrecision(std::vector<float>& out) const {
  // All ranks agree on whether any gradient exists before gathering.
  int32_t missing = grad_shard_.allocated() ? 0 : 1;
  if (sharded()) {
    RETURN_IF_ERROR(p_.host_shard->AllReduce(&missing, 1, DType::kInt32, ReduceOp::kSum));
  }
  const int world = sharded() ? layout().world_size() : 1;
  out.clear();
  if (missing == world) return absl::OkStatus();
  const size_t s = shard_.bytes() / sizeof(float);
  ASSIGN_OR_RETURN(std::vector<float> local, ReadGradShard());
  if (local.empty()) local.assign(s, 0.0f);
  if (!sharded()) {
    out = std::move(local);
    return absl::OkStatus();
  }
  out.resize(s * static_cast<size_t>(world));
  RETURN_IF_ERROR(p_.host_shard->AllGather(local.data(), out.data(), s, DType::kFloat32));
  out.resize(AsSize(layout().unpadded_unsharded_numel()));
  return absl::OkStatus();
}

absl::Status FlatParamUnit::GatherShardValues(std::span<const float> values,
                                              std::vector<float>& out) const {
  const size_t n = AsSize(layout().unpadded_unsharded_numel());
  const size_t s = shard_.bytes() / sizeof(float);
  if (values.size() != s) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard values hold ", values.size(), " elements, the shard ", s));
  }
  if (!sharded()) {
    out.assign(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(n));
    return absl::OkStatus();
  }
  std::vector<float> all(s * AsSize(layout().world_size()));
  RETURN_IF_ERROR(p_.host_shard->AllGather(values.data(), all.data(), s, DType::kFloat32));
  all.resize(n);
  out = std::move(all);
  return absl::OkStatus();
}

}  // namespace flatshard
