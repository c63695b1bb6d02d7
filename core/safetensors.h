// The safetensors file format (https://github.com/huggingface/safetensors):
// an 8-byte little-endian header length N, N bytes of JSON mapping each
// tensor name to {dtype, shape, data_offsets: [begin, end)} relative to the
// data section (plus an optional "__metadata__" string map), then the data.
// The writer lays tensors out contiguously in name order and pads the header
// with spaces to a multiple of 8, as the reference implementation does, and
// writes through a temporary file renamed into place, so a reader never sees
// half a file.
#ifndef FLATSHARD_CORE_SAFETENSORS_H_
#define FLATSHARD_CORE_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "core/dtype.h"

namespace flatshard {

struct SafetensorsTensor {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::string data;  // little-endian, row-major; NumElements(shape) * DTypeSize(dtype) bytes
};

// Dtype names in the header: SafetensorsDTypeName / ParseSafetensorsDType
// (core/dtype.h).

// One tensor's entry in a header; data follows in the order of the slots.
struct SafetensorsSlot {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
};

// The 8-byte length and the space-padded JSON header for `slots`, laid out
// contiguously in the given order. INVALID_ARGUMENT for an empty, reserved or
// repeated name.
absl::StatusOr<std::string> EncodeSafetensorsHeader(
    const std::vector<SafetensorsSlot>& slots,
    const std::map<std::string, std::string>& metadata = {});

// The whole file's bytes. INVALID_ARGUMENT naming the tensor whose data size
// disagrees with its dtype and shape.
absl::StatusOr<std::string> SerializeSafetensors(
    const std::map<std::string, SafetensorsTensor>& tensors,
    const std::map<std::string, std::string>& metadata = {});

}  // namespace flatshard

#endif  // FLATSHARD_CORE_SAFETENSORS_H_
