// cuBLAS, opened at run time (dlopen) instead of linked. libcublasLt carries
// about 94 KiB of static TLS, and glibc places a linked library's static TLS on
// every thread's stack: linked into the worker, it leaves civetweb's 100 KiB
// metrics-server thread no room, pthread_create fails and the worker cannot
// serve /metrics even on machines without a GPU. A library opened later gets
// dynamic TLS instead, so the CUDA device opens cuBLAS when it is created, and
// only then. The entry points are typed from cublas_v2.h, so a mismatch with
// the header does not compile.
#ifndef FLATSHARD_WORKER_DEVICE_CUDA_CUBLAS_API_H_
#define FLATSHARD_WORKER_DEVICE_CUDA_CUBLAS_API_H_

#include <cublas_v2.h>

#include "absl/status/statusor.h"

namespace flatshard::cuda {

struct CublasApi {
  decltype(&cublasCreate_v2) Create = nullptr;
  decltype(&cublasDestroy_v2) Destroy = nullptr;
  decltype(&cublasSetStream_v2) SetStream = nullptr;
  decltype(&cublasSetMathMode) SetMathMode = nullptr;
  decltype(&cublasSetWorkspace_v2) SetWorkspace = nullptr;
  decltype(&cublasSgemm_v2) Sgemm = nullptr;
  decltype(&cublasSgemmStridedBatched) SgemmStridedBatched = nullptr;
  decltype(&cublasGetStatusString) GetStatusString = nullptr;
};

// Opens libcublas of the major version this build was compiled against, once
// per process; FAILED_PRECONDITION naming the library and dlerror() otherwise.
absl::StatusOr<const CublasApi*> LoadCublas();

// The loaded API. Only after a successful LoadCublas (CudaDevice::Create).
const CublasApi& Cublas();

}  // namespace flatshard::cuda

#endif  // FLATSHARD_WORKER_DEVICE_CUDA_CUBLAS_API_H_
