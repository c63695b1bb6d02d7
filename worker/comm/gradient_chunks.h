// The FSDP gradient as a fused reduce-scatter sees it (ReduceScatterChunks,
// communicator.h): each chunk of the padded, cast and pre-divided gradient is
// computed from the unpadded fp32 gradient where the ring first touches it,
// and this rank's reduced chunk is post-divided and accumulated into the fp32
// gradient shard as the ring completes it. Element for element the formulas of
// worker/device/kernels/element_ops.h that Stream::PrepareGradForReduce and
// Stream::AccumulateReducedGrad apply, and the sum ReduceElements forms, so the
// fused reduction equals the three separate steps bit for bit.
#ifndef FLATSHARD_WORKER_COMM_GRADIENT_CHUNKS_H_
#define FLATSHARD_WORKER_COMM_GRADIENT_CHUNKS_H_

#include <cstddef>
#include <memory>

#include "core/dtype.h"
#include "worker/comm/communicator.h"
#include "worker/device/host/host_isa.h"

namespace flatshard {

struct GradientChunksSpec {
  const float* grad = nullptr;           // the unpadded gradient
  size_t grad_count = 0;                 // its elements; the padding past it is zero
  size_t count = 0;                      // elements per chunk (the shard)
  DType reduce_dtype = DType::kFloat32;  // float32, bfloat16 or float16
  double pre_divide = 1.0;
  double post_divide = 1.0;
  float* grad_shard = nullptr;  // `count` elements, accumulated into
  // false: grad_shard holds nothing yet and is written, as accumulating into
  // zeros would (GradientReduction::accumulate).
  bool accumulate = true;
  // Which compiled copy of the element loops runs (tests compare them).
  host_kernels::HostIsa isa = host_kernels::HostIsa::kBest;
};

std::unique_ptr<ReduceScatterChunks> MakeGradientChunks(const GradientChunksSpec& spec);

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_COMM_GRADIENT_CHUNKS_H_
