// OpenBLAS's cblas_sgemm, opened at run time (dlopen) instead of linked.
// OpenBLAS carries 60 KiB of static TLS, and glibc places every linked library's
// static TLS on each thread's stack: in the worker daemon, together with the
// CUDA runtime and NCCL, it leaves civetweb's fixed 100 KiB metrics-server
// threads too little stack, and serving /metrics overflows it. A library opened
// with dlopen gets dynamic TLS, which no thread stack pays for. The entry point
// is typed from cblas.h, so a mismatch with the header does not compile.
#ifndef FLATSHARD_WORKER_DEVICE_HOST_CBLAS_API_H_
#define FLATSHARD_WORKER_DEVICE_HOST_CBLAS_API_H_

#include <cblas.h>

namespace flatshard {

struct CblasApi {
  decltype(&cblas_sgemm) sgemm = nullptr;
  // The kernel family OpenBLAS runs ("Haswell", "Cooperlake"): chosen by CPU
  // when it is opened, or named by OPENBLAS_CORETYPE. It halves or doubles the
  // CPU path's GEMM rate on an AVX-512 machine, so the worker logs it.
  decltype(&openblas_get_corename) corename = nullptr;
  // Its thread pool: OPENBLAS_NUM_THREADS or one thread per core unless set.
  // Several CPU workers on one host each want a share of the cores, not all
  // of them: idle pool threads spin in sched_yield, taking the cores the
  // other workers' compute and TCP copies need.
  decltype(&openblas_set_num_threads) set_num_threads = nullptr;
  decltype(&openblas_get_num_threads) num_threads = nullptr;
};

// The OpenBLAS entry points, opened on first use. OpenBLAS is a hard dependency
// (scripts/setup.sh installs it): if it cannot be opened the process stops with
// a message naming the library, as the dynamic linker would have at start.
const CblasApi& Cblas();

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_DEVICE_HOST_CBLAS_API_H_
