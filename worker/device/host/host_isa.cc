#include "worker/device/host/host_isa.h"

namespace flatshard::host_kernels {
namespace {

bool CpuHasAvx2Fma() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
#else
  return false;
#endif
}

}  // namespace

bool HostIsaSupported(HostIsa isa) { return isa != HostIsa::kAvx2Fma || CpuHasAvx2Fma(); }

bool UseAvx2Fma(HostIsa isa) {
  return isa == HostIsa::kAvx2Fma || (isa == HostIsa::kBest && CpuHasAvx2Fma());
}

}  // namespace flatshard::host_kernels
