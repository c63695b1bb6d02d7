#include "core/device_kind.h"

#include "absl/strings/str_cat.h"

namespace flatshard {

absl::string_view DeviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kCuda:
      return "cuda";
    case DeviceKind::kSim:
      return "sim";
  }
  return "?";
}

absl::StatusOr<DeviceKind> ParseDeviceKind(absl::string_view name) {
  for (DeviceKind kind : {DeviceKind::kCpu, DeviceKind::kCuda, DeviceKind::kSim}) {
    if (name == DeviceKindName(kind)) return kind;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown device kind '", name, "'; expected cpu, cuda or sim"));
}

}  // namespace flatshard
