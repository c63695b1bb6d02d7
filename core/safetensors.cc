#include "core/safetensors.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

#include "core/model_spec.h"

namespace flatshard {

absl::StatusOr<std::string> SerializeSafetensors(
    const std::map<std::string, SafetensorsTensor>& tensors,
    const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header["__metadata__"] = meta;
  }
  size_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name.empty() || name == "__metadata__") {
      return absl::InvalidArgumentError(absl::StrCat("tensor name '", name, "' is reserved"));
    }
    const auto expected = static_cast<size_t>(NumElements(tensor.shape)) * DTypeSize(tensor.dtype);
    if (tensor.data.size() != expected) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has ", tensor.data.size(),
                                                     " bytes, its dtype and "
                                                     "shape need ",
                                                     expected));
    }
    header[name] = {{"dtype", std::string(SafetensorsDTypeName(tensor.dtype))},
                    {"shape", tensor.shape},
                    {"data_offsets", {offset, offset + expected}}};
    offset += expected;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out;
  out.reserve(8 + json.size() + offset);
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out += json;
  for (const auto& [name, tensor] : tensors) out += tensor.data;
  return out;
}

absl::Status WriteSafetensorsFile(const std::string& path,
                                  const std::map<std::string, SafetensorsTensor>& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  absl::StatusOr<std::string> bytes = SerializeSafetensors(tensors, metadata);
  if (!bytes.ok()) return bytes.status();
  const std::string tmp = path + ".partial";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      return absl::UnavailableError(absl::StrCat("cannot write ", tmp));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    return absl::UnavailableError(
        absl::StrCat("cannot rename ", tmp, " to ", path, ": ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace flatshard
