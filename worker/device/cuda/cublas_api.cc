#include "worker/device/cuda/cublas_api.h"

#include <mutex>
#include <string>

#include <dlfcn.h>

#include "absl/strings/str_cat.h"

namespace flatshard::cuda {
namespace {

CublasApi api;
absl::Status load_status = absl::FailedPreconditionError("cuBLAS was not loaded");
std::once_flag once;

template <typename Fn>
bool Bind(void* library, const char* symbol, Fn& out, std::string& missing) {
  out = reinterpret_cast<Fn>(dlsym(library, symbol));
  if (out == nullptr) missing = symbol;
  return out != nullptr;
}

void Load() {
  const std::string name = absl::StrCat("libcublas.so.", CUBLAS_VER_MAJOR);
  void* library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* error = dlerror();
    load_status = absl::FailedPreconditionError(
        absl::StrCat("cannot open ", name,
                     " (the CUDA toolkit's cuBLAS; put its directory on "
                     "LD_LIBRARY_PATH): ",
                     error != nullptr ? error : "unknown error"));
    return;
  }
  std::string missing;
  const bool ok = Bind(library, "cublasCreate_v2", api.Create, missing) &&
                  Bind(library, "cublasDestroy_v2", api.Destroy, missing) &&
                  Bind(library, "cublasSetStream_v2", api.SetStream, missing) &&
                  Bind(library, "cublasSetMathMode", api.SetMathMode, missing) &&
                  Bind(library, "cublasSetWorkspace_v2", api.SetWorkspace, missing) &&
                  Bind(library, "cublasSgemm_v2", api.Sgemm, missing) &&
                  Bind(library, "cublasSgemmStridedBatched", api.SgemmStridedBatched, missing) &&
                  Bind(library, "cublasGetStatusString", api.GetStatusString, missing);
  load_status = ok ? absl::OkStatus()
                   : absl::FailedPreconditionError(
                         absl::StrCat(name, " has no symbol ", missing, ": ", dlerror()));
}

}  // namespace

absl::StatusOr<const CublasApi*> LoadCublas() {
  std::call_once(once, Load);
  if (!load_status.ok()) return load_status;
  return &api;
}

const CublasApi& Cublas() { return api; }

}  // namespace flatshard::cuda
