#include "core/yaml_fields.h"

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace flatshard {
namespace {

absl::string_view KindName(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Scalar:
      return "a scalar";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Undefined:
      return "missing";
  }
  return "?";
}

// RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF.
bool IsValidUtf8(absl::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<unsigned char>(text[i]);
    // Continuation bytes, and the smallest code point needing that many.
    size_t extra = 0;
    uint32_t min = 0;
    if (lead < 0x80) {
      ++i;
      continue;
    }
    if ((lead & 0xE0) == 0xC0) {
      extra = 1;
      min = 0x80;
    } else if ((lead & 0xF0) == 0xE0) {
      extra = 2;
      min = 0x800;
    } else if ((lead & 0xF8) == 0xF0) {
      extra = 3;
      min = 0x10000;
    } else {
      return false;
    }
    if (text.size() - i <= extra) return false;
    uint32_t point = lead & (0x3Fu >> extra);
    for (size_t k = 1; k <= extra; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xC0) != 0x80) return false;
      point = (point << 6) | (next & 0x3Fu);
    }
    if (point < min || point > 0x10FFFF || (point >= 0xD800 && point <= 0xDFFF)) return false;
    i += extra + 1;
  }
  return true;
}

}  // namespace

int YamlField::line() const {
  if (!node.IsDefined()) return 0;
  return node.Mark().line >= 0 ? node.Mark().line + 1 : 0;
}

absl::Status YamlField::Error(absl::string_view problem) const {
  std::string where = *source;
  if (line() > 0) absl::StrAppend(&where, ":", line());
  return absl::InvalidArgumentError(
      absl::StrCat(where, ": ", path.empty() ? "document" : path, ": ", problem));
}

bool YamlField::Has(absl::string_view key) const {
  return node.IsMap() && node[std::string(key)].IsDefined();
}

YamlField YamlField::Child(absl::string_view key) const {
  YAML::Node child = node.IsMap() ? node[std::string(key)] : YAML::Node();
  // Undefined children keep the parent's mark so "missing" errors still point
  // at a line.
  return YamlField{child.IsDefined() ? child : node,
                   path.empty() ? std::string(key) : absl::StrCat(path, ".", key), source};
}

YamlField YamlField::Element(size_t i) const {
  return YamlField{node[i], absl::StrCat(path, "[", i, "]"), source};
}

size_t YamlField::size() const { return node.size(); }

absl::Status YamlField::ExpectMap() const {
  if (node.IsMap()) return absl::OkStatus();
  return Error(absl::StrCat("expected a mapping, got ", KindName(node)));
}

absl::Status YamlField::ExpectSequence() const {
  if (node.IsSequence()) return absl::OkStatus();
  return Error(absl::StrCat("expected a list, got ", KindName(node)));
}

absl::Status YamlField::OnlyKeys(std::initializer_list<absl::string_view> allowed,
                                 const std::vector<absl::string_view>& also) const {
  if (absl::Status s = ExpectMap(); !s.ok()) return s;
  for (const auto& entry : node) {
    std::string key;
    if (!YAML::convert<std::string>::decode(entry.first, key)) {
      return Error("mapping keys must be strings");
    }
    bool known = false;
    for (absl::string_view a : allowed) known = known || a == key;
    for (absl::string_view a : also) known = known || a == key;
    if (!known) {
      std::vector<absl::string_view> all(allowed);
      all.insert(all.end(), also.begin(), also.end());
      YamlField field{entry.first, path.empty() ? key : absl::StrCat(path, ".", key), source};
      return field.Error(absl::StrCat("unknown field '", key,
                                      "' (expected one of: ", absl::StrJoin(all, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> YamlField::AsString() const {
  std::string value;
  if (!node.IsScalar() || !YAML::convert<std::string>::decode(node, value)) {
    return Error(absl::StrCat("expected a string, got ", KindName(node)));
  }
  // Specs become protobuf messages, whose strings must be UTF-8: other bytes
  // would pass here and fail only in the receiving daemon's parser.
  if (!IsValidUtf8(value)) return Error("is not valid UTF-8 text");
  return value;
}

absl::StatusOr<int64_t> YamlField::AsInt() const {
  int64_t value = 0;
  if (!node.IsScalar() || !YAML::convert<int64_t>::decode(node, value)) {
    return Error(absl::StrCat("expected an integer, got ", node.IsScalar()
                                                               ? "'" + node.Scalar() + "'"
                                                               : std::string(KindName(node))));
  }
  return value;
}

absl::StatusOr<double> YamlField::AsDouble() const {
  double value = 0;
  if (!node.IsScalar() || !YAML::convert<double>::decode(node, value)) {
    return Error(absl::StrCat("expected a number, got ", node.IsScalar()
                                                             ? "'" + node.Scalar() + "'"
                                                             : std::string(KindName(node))));
  }
  return value;
}

absl::StatusOr<bool> YamlField::AsBool() const {
  bool value = false;
  if (!node.IsScalar() || !YAML::convert<bool>::decode(node, value)) {
    return Error(absl::StrCat("expected true or false, got ", node.IsScalar()
                                                                  ? "'" + node.Scalar() + "'"
                                                                  : std::string(KindName(node))));
  }
  return value;
}

absl::StatusOr<YAML::Node> ParseYamlDocument(absl::string_view text, const std::string& source) {
  try {
    YAML::Node node = YAML::Load(std::string(text));
    if (!node.IsDefined() || node.IsNull()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": the document is empty"));
    }
    return node;
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ":", e.mark.line + 1, ":", e.mark.column + 1, ": ", e.msg));
  }
}

}  // namespace flatshard
