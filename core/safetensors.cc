#include "core/safetensors.h"

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

#include "core/model_spec.h"

namespace flatshard {

absl::StatusOr<std::string> EncodeSafetensorsHeader(
    const std::vector<SafetensorsSlot>& slots, const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header["__metadata__"] = meta;
  }
  uint64_t offset = 0;
  for (const SafetensorsSlot& slot : slots) {
    if (slot.name.empty() || slot.name == "__metadata__" || header.contains(slot.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor name '", slot.name, "' is empty, reserved or repeated"));
    }
    const uint64_t bytes = static_cast<uint64_t>(NumElements(slot.shape)) * DTypeSize(slot.dtype);
    header[slot.name] = {{"dtype", std::string(SafetensorsDTypeName(slot.dtype))},
                         {"shape", slot.shape},
                         {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out;
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return out + json;
}

absl::StatusOr<std::string> SerializeSafetensors(
    const std::map<std::string, SafetensorsTensor>& tensors,
    const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsSlot> slots;
  size_t data_bytes = 0;
  for (const auto& [name, tensor] : tensors) {
    const auto expected = static_cast<size_t>(NumElements(tensor.shape)) * DTypeSize(tensor.dtype);
    if (tensor.data.size() != expected) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has ", tensor.data.size(),
                                                     " bytes, its dtype and shape need ",
                                                     expected));
    }
    slots.push_back({name, tensor.dtype, tensor.shape});
    data_bytes += expected;
  }
  absl::StatusOr<std::string> out = EncodeSafetensorsHeader(slots, metadata);
  if (!out.ok()) return out.status();
  out->reserve(out->size() + data_bytes);
  for (const auto& [name, tensor] : tensors) *out += tensor.data;
  return out;
}

}  // namespace flatshard
