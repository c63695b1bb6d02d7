// NumPy's .npy format (format versions 1.0, 2.0 and 3.0), read strictly:
// a little-endian float32, int32 or int64 C-order array, with the header
// dictionary parsed field by field and the data length checked against the
// shape. Every error names the file and what is wrong with it. Also writes the
// same format, for tests and for preparing data sets.
#ifndef FLATSHARD_WORKER_COMPUTE_NPY_H_
#define FLATSHARD_WORKER_COMPUTE_NPY_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "core/dtype.h"

namespace flatshard::compute {

struct NpyArray {
  DType dtype = DType::kFloat32;  // kFloat32, kInt32 or kInt64
  std::vector<int64_t> shape;     // () is a scalar
  std::vector<std::byte> data;    // little-endian, C order, numel * DTypeSize bytes

  int64_t numel() const;
};

// Parses the bytes of a .npy file; `source` names it in errors.
// INVALID_ARGUMENT for a bad magic, version, header or length; UNIMPLEMENTED
// for valid .npy files flatshard does not read (other dtypes, big-endian,
// fortran_order: True).
absl::StatusOr<NpyArray> ParseNpy(absl::string_view bytes, absl::string_view source);

// Reads and parses a file; NOT_FOUND when it cannot be opened.
absl::StatusOr<NpyArray> ReadNpyFile(const std::string& path);

// A version 1.0 .npy file (header padded to 64 bytes, as NumPy writes it).
// `data` must hold numel * DTypeSize(dtype) bytes.
std::string EncodeNpy(DType dtype, const std::vector<int64_t>& shape,
                      std::span<const std::byte> data);
absl::Status WriteNpyFile(const std::string& path, DType dtype, const std::vector<int64_t>& shape,
                          std::span<const std::byte> data);

}  // namespace flatshard::compute

#endif  // FLATSHARD_WORKER_COMPUTE_NPY_H_
