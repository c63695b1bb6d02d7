// The one way a worker gets its Device: from the --device kind (and GPU index),
// so the daemon, the local trainer, benchmarks and tests choose devices alike.
#ifndef FLATSHARD_WORKER_DEVICE_DEVICE_FACTORY_H_
#define FLATSHARD_WORKER_DEVICE_DEVICE_FACTORY_H_

#include <memory>

#include "absl/status/statusor.h"

#include "worker/device/device.h"
#include "worker/device/sim/sim_device.h"

namespace flatshard {

struct DeviceOptions {
  DeviceKind kind = DeviceKind::kCpu;
  int gpu = 0;     // cuda: the device index among the visible ones
  SimOptions sim;  // sim: delays and their seed
};

// FAILED_PRECONDITION for `cuda` when this build has no CUDA support or no
// CUDA device is visible (the message says which).
absl::StatusOr<std::shared_ptr<Device>> CreateDevice(const DeviceOptions& options);

// Whether this binary was built with the CUDA path.
bool BuiltWithCuda();

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_DEVICE_DEVICE_FACTORY_H_
