// Collectives over device memory, ordered on a device stream: what the FSDP
// runtime's unshard and gradient reduction issue (docs/architecture.md §5). A
// collective is enqueued on `stream` like a kernel: it starts after the work
// issued on that stream before it, later work on the stream sees its result,
// and other streams order themselves against it with events. Implementations:
//   - HostCollectives (host_collectives.h): a Gloo Communicator run by the
//     host-executed streams of the CPU and simulated devices;
//   - NcclCollectives (nccl_collectives.h): NCCL on the CUDA stream;
//   - StagedCollectives (staged_collectives.h): Gloo for CUDA memory through
//     pinned host buffers (GPUs without NCCL, several ranks on one GPU).
// Contract otherwise as Communicator's (communicator.h): every rank issues the
// same collectives in the same order; errors are sticky on the stream; Abort
// makes pending and future collectives fail promptly.
#ifndef FLATSHARD_WORKER_COMM_COLLECTIVES_H_
#define FLATSHARD_WORKER_COMM_COLLECTIVES_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "core/dtype.h"
#include "worker/comm/communicator.h"
#include "worker/device/stream.h"

namespace flatshard {

// One unit's gradient reduction (docs/fsdp-semantics.md §3.2) as one
// collective over a sharded group: the unpadded fp32 gradient is cast to the
// reduce dtype, divided by pre_divide and padded with zeros to size()*count
// elements, reduce-scattered, and this rank's reduced chunk divided by
// post_divide and added to the fp32 gradient shard, element for element what
// Stream::PrepareGradForReduce, ReduceScatterInPlace and
// Stream::AccumulateReducedGrad compute.
struct GradientReduction {
  DeviceSpan<const float> grad;  // the unsharded gradient, at most size()*count elements
  DType reduce_dtype = DType::kFloat32;
  double pre_divide = 1.0;
  double post_divide = 1.0;
  // size()*count elements of reduce_dtype, scratch. In float32 it may be the
  // gradient's own buffer (starting at grad, zeros past it), reduced in place.
  DeviceSpan<std::byte> work;
  size_t count = 0;              // the shard's elements
  DeviceSpan<float> grad_shard;  // count elements, accumulated into
  // false when grad_shard was just allocated and holds nothing: it is then
  // written with what accumulating into zeros gives, without being zeroed
  // and read first. On failure its contents are unspecified (a failed
  // collective ends the runtime; the next epoch configures a new one).
  bool accumulate = true;
};

class Collectives {
 public:
  virtual ~Collectives() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Rank r's `count` elements of `input` land at output[r*count, (r+1)*count).
  virtual absl::Status AllGather(Stream& stream, DeviceSpan<const std::byte> input,
                                 DeviceSpan<std::byte> output, size_t count, DType dtype) = 0;
  // `input` holds size()*count elements; rank r gets the SUM of every rank's
  // chunk r in `output` (count elements).
  virtual absl::Status ReduceScatter(Stream& stream, DeviceSpan<const std::byte> input,
                                     DeviceSpan<std::byte> output, size_t count, DType dtype) = 0;
  // In place (Communicator::ReduceScatterInPlace, NCCL's in-place form):
  // `buffer` holds size()*count elements; afterwards chunk rank() holds the
  // SUM and the other chunks are scratch.
  virtual absl::Status ReduceScatterInPlace(Stream& stream, DeviceSpan<std::byte> buffer,
                                            size_t count, DType dtype) = 0;
  // GradientReduction above, enqueued on `stream`. This default issues the
  // three steps (two kernels around the in-place reduce-scatter); the host
  // collectives fold the kernels' element passes into their ring.
  virtual absl::Status ReduceGradient(Stream& stream, const GradientReduction& r);
  // In place over `count` elements.
  virtual absl::Status AllReduce(Stream& stream, DeviceSpan<std::byte> buffer, size_t count,
                                 DType dtype, ReduceOp op) = 0;
  // In place: every rank ends with root's `count` elements.
  virtual absl::Status Broadcast(Stream& stream, DeviceSpan<std::byte> buffer, size_t count,
                                 DType dtype, int root) = 0;

  virtual void Abort(const std::string& reason) = 0;

  // A group over `ranks` (this group's ranks, ascending, including this one);
  // only members call it, all with the same ranks and name.
  virtual absl::StatusOr<std::unique_ptr<Collectives>> CreateSubgroup(const std::vector<int>& ranks,
                                                                      absl::string_view name) = 0;
};

// INVALID_ARGUMENT naming `op` unless `input` holds `in_count` and `output`
// `out_count` elements of `dtype`: shared by the implementations.
absl::Status CheckCollectiveSizes(absl::string_view op, size_t input_bytes, size_t in_count,
                                  size_t output_bytes, size_t out_count, DType dtype);

// INVALID_ARGUMENT naming the field unless `r` is a reduction over a group of
// `group_size` ranks: a gradient dtype, a gradient no longer than the padded
// input, a work buffer that holds it, and a shard of `count` elements.
absl::Status CheckGradientReduction(const GradientReduction& r, int group_size);

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_COMM_COLLECTIVES_H_
