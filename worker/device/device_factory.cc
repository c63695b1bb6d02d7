#include "worker/device/device_factory.h"

#include "worker/device/host/host_device.h"

#if defined(FLATSHARD_HAVE_CUDA)
#include "worker/device/cuda/cuda_device.h"
#endif

namespace flatshard {

bool BuiltWithCuda() {
#if defined(FLATSHARD_HAVE_CUDA)
  return true;
#else
  return false;
#endif
}

absl::StatusOr<std::shared_ptr<Device>> CreateDevice(const DeviceOptions& options) {
  switch (options.kind) {
    case DeviceKind::kCpu:
      return std::shared_ptr<Device>(std::make_shared<HostDevice>());
    case DeviceKind::kSim:
      return std::shared_ptr<Device>(std::make_shared<SimDevice>(options.sim));
    case DeviceKind::kCuda: {
#if defined(FLATSHARD_HAVE_CUDA)
      absl::StatusOr<std::unique_ptr<cuda::CudaDevice>> device =
          cuda::CudaDevice::Create(options.gpu);
      if (!device.ok()) return device.status();
      return std::shared_ptr<Device>(std::move(*device));
#else
      return absl::FailedPreconditionError(
          "device cuda: this flatshard was built without CUDA (configure with FLATSHARD_CUDA=ON "
          "where the CUDA toolkit and NCCL are installed)");
#endif
    }
  }
  return absl::InvalidArgumentError("unknown device kind");
}

}  // namespace flatshard
