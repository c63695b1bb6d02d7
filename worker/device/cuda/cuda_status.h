// CUDA and NCCL error codes as absl::Status, and whether a usable device is
// present. Code that needs a GPU asks CudaDeviceCount() first so that it (and
// its tests) can step aside cleanly on machines without one.
#ifndef FLATSHARD_WORKER_DEVICE_CUDA_CUDA_STATUS_H_
#define FLATSHARD_WORKER_DEVICE_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "absl/status/status.h"

namespace flatshard::cuda {

// FAILED_PRECONDITION for a missing device or driver, INTERNAL otherwise; the
// message carries `what` and CUDA's own error string.
absl::Status CudaStatus(cudaError_t error, const char* what);
absl::Status NcclStatus(ncclResult_t result, const char* what);

// Devices visible to this process; 0 when there is no driver or no GPU (never an
// error: absence is a normal condition on CPU machines).
int CudaDeviceCount();

// NCCL's version as a number (e.g. 22703), from the linked library.
int NcclVersion();

}  // namespace flatshard::cuda

#endif  // FLATSHARD_WORKER_DEVICE_CUDA_CUDA_STATUS_H_
