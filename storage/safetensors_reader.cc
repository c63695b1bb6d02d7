#include "storage/safetensors_reader.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

#include "core/status_macros.h"

namespace flatshard {
namespace {

using Json = nlohmann::json;

absl::Status Invalid(absl::string_view what, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", problem));
}

uint64_t ReadLe64(absl::string_view bytes) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) {
    n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  }
  return n;
}

absl::StatusOr<SafetensorsEntry> ParseEntry(absl::string_view what, const std::string& name,
                                            const Json& value) {
  const std::string where = absl::StrCat("tensor '", name, "'");
  if (!value.is_object()) return Invalid(what, absl::StrCat(where, " is not a JSON object"));
  for (const auto& [key, unused] : value.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return Invalid(what, absl::StrCat(where, " has unknown field '", key, "'"));
    }
  }
  if (!value.contains("dtype") || !value["dtype"].is_string()) {
    return Invalid(what, absl::StrCat(where, " needs a string 'dtype'"));
  }
  SafetensorsEntry entry;
  absl::StatusOr<DType> dtype = ParseSafetensorsDType(value["dtype"].get<std::string>());
  if (!dtype.ok()) return Invalid(what, absl::StrCat(where, ": ", dtype.status().message()));
  entry.dtype = *dtype;
  if (!value.contains("shape") || !value["shape"].is_array()) {
    return Invalid(what, absl::StrCat(where, " needs an array 'shape'"));
  }
  // Elements, bounded as we go so a hostile shape cannot overflow.
  constexpr uint64_t kMaxNumel = uint64_t{1} << 58;  // bytes stay below 2^61 for any dtype
  uint64_t numel = 1;
  for (const Json& dim : value["shape"]) {
    if (!dim.is_number_unsigned()) {
      return Invalid(what, absl::StrCat(where,
                                        " has a shape entry that is not a "
                                        "non-negative integer: ",
                                        dim.dump()));
    }
    const uint64_t d = dim.get<uint64_t>();
    if (d > static_cast<uint64_t>(INT64_MAX)) {
      return Invalid(what, absl::StrCat(where, " has a dimension too large"));
    }
    entry.shape.push_back(static_cast<int64_t>(d));
    if (d != 0 && numel > kMaxNumel / d) {
      return Invalid(what, absl::StrCat(where, " has more elements than any file can hold"));
    }
    numel *= d;
  }
  const Json* offsets = value.contains("data_offsets") ? &value["data_offsets"] : nullptr;
  if (offsets == nullptr || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
    return Invalid(what, absl::StrCat(where,
                                      " needs 'data_offsets': [begin, end] of "
                                      "non-negative integers"));
  }
  entry.begin = (*offsets)[0].get<uint64_t>();
  entry.end = (*offsets)[1].get<uint64_t>();
  if (entry.end < entry.begin) {
    return Invalid(what, absl::StrCat(where, " has data_offsets [", entry.begin, ", ", entry.end,
                                      "] that end before they begin"));
  }
  const uint64_t bytes = numel * DTypeSize(entry.dtype);
  if (bytes != entry.end - entry.begin) {
    return Invalid(what, absl::StrCat(where, " spans ", entry.end - entry.begin,
                                      " bytes but its dtype and shape need ", bytes));
  }
  return entry;
}

}  // namespace

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view prefix,
                                                         uint64_t file_size,
                                                         absl::string_view what) {
  if (file_size < 8 || prefix.size() < 8) {
    return absl::DataLossError(
        absl::StrCat(what, ": ", file_size, " bytes is too short for a safetensors file"));
  }
  const uint64_t n = ReadLe64(prefix);
  if (n < 2 || n > kMaxSafetensorsHeaderBytes) {
    return Invalid(what, absl::StrCat("header length ", n, " is outside [2, ",
                                      kMaxSafetensorsHeaderBytes, "]"));
  }
  if (8 + n > file_size) {
    return absl::DataLossError(absl::StrCat(what, ": header length ", n,
                                            " runs past the end of the ", file_size,
                                            "-byte file (truncated?)"));
  }
  if (prefix.size() < 8 + n) {
    return absl::InternalError(absl::StrCat(what, ": caller passed too few header bytes"));
  }
  const absl::string_view text = prefix.substr(8, n);
  if (text.front() != '{') return Invalid(what, "header does not start with '{'");
  Json header = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return Invalid(what, "header is not a JSON object");
  }
  SafetensorsHeader out;
  out.data_start = 8 + n;
  const uint64_t data_size = file_size - out.data_start;
  std::vector<std::pair<uint64_t, std::string>> order;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) return Invalid(what, "__metadata__ is not a JSON object");
      for (const auto& [key, v] : value.items()) {
        if (!v.is_string()) {
          return Invalid(what, absl::StrCat("__metadata__ value for '", key, "' is not a string"));
        }
        out.metadata[key] = v.get<std::string>();
      }
      continue;
    }
    if (name.empty()) return Invalid(what, "a tensor has an empty name");
    ASSIGN_OR_RETURN(SafetensorsEntry entry, ParseEntry(what, name, value));
    order.emplace_back(entry.begin, name);
    out.tensors.emplace(name, std::move(entry));
  }
  // The data section must be tiled exactly: sorted by begin, each tensor
  // starts where the previous ended, and the last ends at the end of the file.
  std::sort(order.begin(), order.end(), [&](const auto& a, const auto& b) {
    const SafetensorsEntry& ea = out.tensors.at(a.second);
    const SafetensorsEntry& eb = out.tensors.at(b.second);
    return ea.begin != eb.begin ? ea.begin < eb.begin : ea.end < eb.end;
  });
  uint64_t expected = 0;
  for (const auto& [begin, name] : order) {
    const SafetensorsEntry& entry = out.tensors.at(name);
    if (entry.begin != expected) {
      return Invalid(what, absl::StrCat("tensor '", name, "' starts at byte ", entry.begin,
                                        " of the data section, expected ", expected,
                                        " (offsets must be contiguous, without gaps or "
                                        "overlaps)"));
    }
    expected = entry.end;
  }
  if (expected != data_size) {
    if (expected > data_size) {
      return absl::DataLossError(absl::StrCat(what, ": tensors need ", expected,
                                              " data bytes, the file holds ", data_size,
                                              " (truncated?)"));
    }
    return Invalid(
        what, absl::StrCat("the file has ", data_size - expected, " bytes after the last tensor"));
  }
  return out;
}

absl::StatusOr<std::map<std::string, SafetensorsTensor>> ParseSafetensors(
    absl::string_view bytes, std::map<std::string, std::string>* metadata, absl::string_view what) {
  ASSIGN_OR_RETURN(SafetensorsHeader header, ParseSafetensorsHeader(bytes, bytes.size(), what));
  std::map<std::string, SafetensorsTensor> tensors;
  for (auto& [name, entry] : header.tensors) {
    SafetensorsTensor& t = tensors[name];
    t.dtype = entry.dtype;
    t.shape = entry.shape;
    const absl::string_view data =
        bytes.substr(header.data_start + entry.begin, entry.end - entry.begin);
    t.data.assign(data.data(), data.size());
  }
  if (metadata != nullptr) *metadata = std::move(header.metadata);
  return tensors;
}

SafetensorsReader::SafetensorsReader(std::string path, int fd, SafetensorsHeader header)
    : path_(std::move(path)), fd_(fd), header_(std::move(header)) {}

SafetensorsReader::~SafetensorsReader() { ::close(fd_); }

namespace {

absl::Status PreadAll(int fd, char* out, uint64_t size, uint64_t offset, const std::string& path) {
  while (size > 0) {
    const ssize_t got = ::pread(fd, out, size, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      return absl::UnavailableError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
    }
    if (got == 0) {
      return absl::DataLossError(
          absl::StrCat(path, " ended early at byte ", offset, " (truncated while open?)"));
    }
    out += got;
    size -= static_cast<uint64_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsReader>> SafetensorsReader::Open(
    const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string message = absl::StrCat("cannot open ", path, ": ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(message) : absl::UnavailableError(message);
  }
  auto fail = [fd](absl::Status status) {
    ::close(fd);
    return status;
  };
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return fail(absl::UnavailableError(absl::StrCat("cannot stat ", path)));
  }
  const auto file_size = static_cast<uint64_t>(st.st_size);
  std::string prefix(8, '\0');
  if (file_size < 8) {
    return fail(absl::DataLossError(
        absl::StrCat(path, ": ", file_size, " bytes is too short for a safetensors file")));
  }
  if (absl::Status s = PreadAll(fd, prefix.data(), 8, 0, path); !s.ok()) return fail(s);
  const uint64_t n = ReadLe64(prefix);
  if (n <= kMaxSafetensorsHeaderBytes && 8 + n <= file_size) {
    prefix.resize(8 + n);
    if (absl::Status s = PreadAll(fd, prefix.data() + 8, n, 8, path); !s.ok()) return fail(s);
  }
  absl::StatusOr<SafetensorsHeader> header = ParseSafetensorsHeader(prefix, file_size, path);
  if (!header.ok()) return fail(header.status());
  return std::unique_ptr<SafetensorsReader>(new SafetensorsReader(path, fd, *std::move(header)));
}

absl::StatusOr<const SafetensorsEntry*> SafetensorsReader::Find(absl::string_view name) const {
  auto it = header_.tensors.find(std::string(name));
  if (it == header_.tensors.end()) {
    return absl::NotFoundError(absl::StrCat(path_, " holds no tensor '", name, "'"));
  }
  return &it->second;
}

absl::StatusOr<std::vector<float>> SafetensorsReader::ReadFloats(absl::string_view name,
                                                                 uint64_t begin,
                                                                 uint64_t end) const {
  if (begin > end) {
    return absl::OutOfRangeError(absl::StrCat(path_, ": elements [", begin, ", ", end,
                                              ") of tensor '", name, "' are not a range"));
  }
  std::vector<float> out(end - begin);
  RETURN_IF_ERROR(ReadFloatsInto(name, begin, out));
  return out;
}

absl::StatusOr<std::pair<const SafetensorsEntry*, uint64_t>> SafetensorsReader::Locate(
    absl::string_view name, uint64_t begin, uint64_t count) const {
  ASSIGN_OR_RETURN(const SafetensorsEntry* entry, Find(name));
  const uint64_t end = begin + count;
  if (end < begin || end > entry->numel()) {
    return absl::OutOfRangeError(absl::StrCat(path_, ": elements [", begin, ", ", end,
                                              ") are outside tensor '", name, "' of ",
                                              entry->numel()));
  }
  if (!IsFloating(entry->dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor '", name, "' is ",
                                                   DTypeName(entry->dtype),
                                                   ", not a floating-point type"));
  }
  return std::make_pair(entry, header_.data_start + entry->begin + begin * DTypeSize(entry->dtype));
}

absl::Status SafetensorsReader::ReadFloatsInto(absl::string_view name, uint64_t begin,
                                               std::span<float> out) const {
  ASSIGN_OR_RETURN(const auto located, Locate(name, begin, out.size()));
  const auto [entry, offset] = located;
  if (entry->dtype == DType::kFloat32) {  // straight into the result
    return PreadAll(fd_, reinterpret_cast<char*>(out.data()), out.size_bytes(), offset, path_);
  }
  std::string raw(out.size() * DTypeSize(entry->dtype), '\0');
  RETURN_IF_ERROR(PreadAll(fd_, raw.data(), raw.size(), offset, path_));
  ConvertElements(entry->dtype, reinterpret_cast<const std::byte*>(raw.data()), DType::kFloat32,
                  reinterpret_cast<std::byte*>(out.data()), out.size());
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> SafetensorsReader::Float32Offset(absl::string_view name, uint64_t begin,
                                                          uint64_t count) const {
  ASSIGN_OR_RETURN(const auto located, Locate(name, begin, count));
  if (located.first->dtype != DType::kFloat32) {
    return absl::FailedPreconditionError(absl::StrCat(
        path_, ": tensor '", name, "' is ", DTypeName(located.first->dtype), ", not float32"));
  }
  return located.second;
}

absl::Status SafetensorsReader::ReadBytes(uint64_t offset, std::span<char> out) const {
  return PreadAll(fd_, out.data(), out.size(), offset, path_);
}

}  // namespace flatshard
