// Strict reading of safetensors files (format: core/safetensors.h). Checkpoints
// come from disk that may be truncated, corrupted or hostile, so nothing in a
// header is trusted: its length is bounded by the file, it must be one JSON
// object, every entry needs a known dtype, a non-negative shape whose byte size
// matches its offsets, and the offsets must tile the data section exactly
// (contiguous from 0 to its end, no gaps or overlaps). Errors are
// INVALID_ARGUMENT (DATA_LOSS for a file shorter than its header says) and
// name the file and the tensor.
#ifndef FLATSHARD_STORAGE_SAFETENSORS_READER_H_
#define FLATSHARD_STORAGE_SAFETENSORS_READER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "core/dtype.h"
#include "core/safetensors.h"

namespace flatshard {

// The safetensors reference refuses headers over 100 MB; so do we.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct SafetensorsEntry {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets inside the data section
  uint64_t end = 0;
  uint64_t numel() const { return (end - begin) / DTypeSize(dtype); }
};

struct SafetensorsHeader {
  std::map<std::string, SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // file offset of the data section: 8 + header length
};

// Parses and validates the header. `prefix` holds at least the file's first
// 8 + N bytes (N the header length it declares); `file_size` is the whole
// file's size, which the data section must fill exactly. `what` names the
// file in messages.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view prefix,
                                                         uint64_t file_size,
                                                         absl::string_view what = "safetensors");

// A whole file in memory, validated as above.
absl::StatusOr<std::map<std::string, SafetensorsTensor>> ParseSafetensors(
    absl::string_view bytes, std::map<std::string, std::string>* metadata = nullptr,
    absl::string_view what = "safetensors");

// Random access to one file: the header is read and validated at Open, tensor
// data is read on demand (pread), so loading a slice never reads the rest.
class SafetensorsReader {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsReader>> Open(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  // NOT_FOUND naming the file when absent.
  absl::StatusOr<const SafetensorsEntry*> Find(absl::string_view name) const;

  // Elements [begin, end) of tensor `name` in row-major order, widened to
  // float32 (F32, BF16 and F16 tensors). OUT_OF_RANGE for a range outside the
  // tensor; DATA_LOSS when the file is shorter than its header promised.
  absl::StatusOr<std::vector<float>> ReadFloats(absl::string_view name, uint64_t begin,
                                                uint64_t end) const;
  // The same for elements [begin, begin + out.size()), straight into `out`
  // (float32 tensors are read into it with no copy in between).
  absl::Status ReadFloatsInto(absl::string_view name, uint64_t begin, std::span<float> out) const;

  // The file offset of element `begin` of float32 tensor `name`, checked as
  // ReadFloatsInto checks elements [begin, begin + count); FAILED_PRECONDITION
  // for a tensor of another floating type (ReadFloatsInto widens those).
  absl::StatusOr<uint64_t> Float32Offset(absl::string_view name, uint64_t begin,
                                         uint64_t count) const;
  // The file's bytes [offset, offset + out.size()) as they are: for a reader
  // that hashes the whole file while it reads it. DATA_LOSS past its end.
  absl::Status ReadBytes(uint64_t offset, std::span<char> out) const;

 private:
  SafetensorsReader(std::string path, int fd, SafetensorsHeader header);
  // Tensor `name` and the file offset of its element `begin`, after the
  // checks every read makes (it exists, the range fits, it is floating point).
  absl::StatusOr<std::pair<const SafetensorsEntry*, uint64_t>> Locate(absl::string_view name,
                                                                      uint64_t begin,
                                                                      uint64_t count) const;

  std::string path_;
  int fd_;
  SafetensorsHeader header_;
};

}  // namespace flatshard

#endif  // FLATSHARD_STORAGE_SAFETENSORS_READER_H_
