#include "core/sharded_tensor_pieces.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace flatshard {

std::string ElementOffsetsToJson(const std::map<std::string, int64_t>& offsets) {
  return nlohmann::json(offsets).dump();
}

absl::StatusOr<ElementOffsets> ParseElementOffsets(absl::string_view json, absl::string_view what) {
  const nlohmann::json parsed =
      nlohmann::json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": metadata '", kElementOffsetsKey, "' is not a JSON object"));
  }
  ElementOffsets offsets;
  for (const auto& [name, value] : parsed.items()) {
    if (!value.is_number_unsigned()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": the element offset of '", name, "' is not a non-negative integer"));
    }
    offsets[name] = value.get<uint64_t>();
  }
  return offsets;
}

absl::Status CheckTiling(std::vector<TensorPiece>& pieces, uint64_t numel, absl::string_view name,
                         absl::string_view where) {
  std::sort(pieces.begin(), pieces.end(),
            [](const TensorPiece& a, const TensorPiece& b) { return a.offset < b.offset; });
  uint64_t next = 0;
  for (const TensorPiece& piece : pieces) {
    if (piece.offset != next) {
      return absl::DataLossError(absl::StrCat(where, ": the pieces of '", name, "' ",
                                              piece.offset > next ? "leave a gap at" : "overlap at",
                                              " element ", std::min(piece.offset, next), " of ",
                                              numel));
    }
    if (piece.count > numel - next) {
      return absl::DataLossError(absl::StrCat(where, ": a piece of '", name, "' at element ",
                                              piece.offset, " runs past its ", numel, " elements"));
    }
    next += piece.count;
  }
  if (next != numel) {
    return absl::DataLossError(absl::StrCat(where, ": the pieces of '", name, "' hold ", next,
                                            " of its ", numel, " elements"));
  }
  return absl::OkStatus();
}

}  // namespace flatshard
