// Elementwise reductions for collectives implemented on the host: acc = acc op in.
// 16-bit types are widened to float32, combined and rounded back (to nearest even)
// per element, which is what NCCL does for bf16/fp16 sums.
#ifndef FLATSHARD_WORKER_COMM_REDUCE_KERNELS_H_
#define FLATSHARD_WORKER_COMM_REDUCE_KERNELS_H_

#include <cstddef>

#include "core/dtype.h"
#include "worker/comm/communicator.h"
#include "worker/device/host/host_isa.h"

namespace flatshard {

// `out` may alias `a`. `isa` picks the compiled copy of the 16-bit combines
// (tests compare them; every copy gives the same bits).
void ReduceElements(DType dtype, ReduceOp op, const void* a, const void* b, void* out, size_t count,
                    host_kernels::HostIsa isa = host_kernels::HostIsa::kBest);

// data[i] /= divisor in the buffer's dtype (computed in float for 16-bit types and
// rounded back), as torch's Tensor.div_ does for FSDP's gradient divide factors.
void DivideElements(DType dtype, void* data, size_t count, double divisor);

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_COMM_REDUCE_KERNELS_H_
