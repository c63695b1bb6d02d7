#include "worker/device/host/cblas_api.h"

#include <cstdio>
#include <cstdlib>

#include <dlfcn.h>

namespace flatshard {
namespace {

// Debian's alternatives link: the pthread OpenBLAS build by default.
constexpr const char* kLibrary = "libopenblas.so.0";

CblasApi Load() {
  void* library = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  CblasApi api;
  if (library != nullptr) {
    api.sgemm = reinterpret_cast<decltype(api.sgemm)>(dlsym(library, "cblas_sgemm"));
    api.corename =
        reinterpret_cast<decltype(api.corename)>(dlsym(library, "openblas_get_corename"));
    api.set_num_threads =
        reinterpret_cast<decltype(api.set_num_threads)>(dlsym(library, "openblas_set_num_threads"));
    api.num_threads =
        reinterpret_cast<decltype(api.num_threads)>(dlsym(library, "openblas_get_num_threads"));
  }
  if (api.sgemm == nullptr || api.corename == nullptr || api.set_num_threads == nullptr ||
      api.num_threads == nullptr) {
    const char* error = dlerror();
    std::fprintf(stderr, "flatshard: cannot use %s (OpenBLAS, for the CPU kernels): %s\n", kLibrary,
                 error != nullptr ? error : "an OpenBLAS entry point is missing");
    std::abort();
  }
  return api;
}

}  // namespace

const CblasApi& Cblas() {
  static const CblasApi api = Load();
  return api;
}

}  // namespace flatshard
