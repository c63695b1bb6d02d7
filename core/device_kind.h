// The kinds of device a worker computes on, named the same by the worker's
// --device flag, its registration, the coordinator's checks and the CLI.
#ifndef FLATSHARD_CORE_DEVICE_KIND_H_
#define FLATSHARD_CORE_DEVICE_KIND_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace flatshard {

// cpu: host memory, OpenBLAS, Gloo. cuda: a GPU, NCCL. sim: the strict
// simulated GPU (host memory behind device rules) that tests use as evidence.
enum class DeviceKind { kCpu, kCuda, kSim };

absl::string_view DeviceKindName(DeviceKind kind);  // "cpu", "cuda", "sim"
// INVALID_ARGUMENT naming the accepted kinds for anything else.
absl::StatusOr<DeviceKind> ParseDeviceKind(absl::string_view name);

}  // namespace flatshard

#endif  // FLATSHARD_CORE_DEVICE_KIND_H_
