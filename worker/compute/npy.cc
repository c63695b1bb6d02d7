#include "worker/compute/npy.h"

#include <bit>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "core/model_spec.h"
#include "core/status_macros.h"

namespace flatshard::compute {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the .npy reader hands out little-endian bytes as they are");

constexpr absl::string_view kMagic = "\x93NUMPY";

// The header's value types: a string, a bool, or a tuple of integers.
struct HeaderValue {
  enum class Kind { kString, kBool, kTuple } kind = Kind::kString;
  std::string text;
  bool flag = false;
  std::vector<int64_t> ints;
};

// Recursive descent over the Python dict literal NumPy writes, e.g.
// {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
class HeaderParser {
 public:
  HeaderParser(absl::string_view text, absl::string_view source) : text_(text), source_(source) {}

  absl::StatusOr<std::map<std::string, HeaderValue>> ParseDict() {
    std::map<std::string, HeaderValue> dict;
    SkipSpaces();
    RETURN_IF_ERROR(Expect('{'));
    SkipSpaces();
    while (!Peek('}')) {
      ASSIGN_OR_RETURN(std::string key, ParseString());
      SkipSpaces();
      RETURN_IF_ERROR(Expect(':'));
      SkipSpaces();
      ASSIGN_OR_RETURN(HeaderValue value, ParseValue());
      if (!dict.emplace(key, std::move(value)).second) {
        return Error(absl::StrCat("key '", key, "' appears twice"));
      }
      SkipSpaces();
      if (Peek(',')) {
        ++pos_;
        SkipSpaces();
      } else if (!Peek('}')) {
        return Error("expected ',' or '}'");
      }
    }
    ++pos_;  // '}'
    SkipSpaces();
    if (pos_ != text_.size()) return Error("unexpected text after the dictionary");
    return dict;
  }

 private:
  absl::StatusOr<HeaderValue> ParseValue() {
    HeaderValue value;
    if (Peek('\'') || Peek('"')) {
      value.kind = HeaderValue::Kind::kString;
      ASSIGN_OR_RETURN(value.text, ParseString());
      return value;
    }
    if (Peek('(')) {
      value.kind = HeaderValue::Kind::kTuple;
      ASSIGN_OR_RETURN(value.ints, ParseTuple());
      return value;
    }
    for (const bool flag : {true, false}) {
      const absl::string_view word = flag ? "True" : "False";
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        value.kind = HeaderValue::Kind::kBool;
        value.flag = flag;
        return value;
      }
    }
    return Error("expected a string, True, False or a tuple");
  }

  absl::StatusOr<std::string> ParseString() {
    if (!Peek('\'') && !Peek('"')) return Error("expected a quoted key or string");
    const char quote = text_[pos_++];
    const size_t end = text_.find(quote, pos_);
    if (end == absl::string_view::npos) return Error("unterminated string");
    std::string s(text_.substr(pos_, end - pos_));
    if (s.find('\\') != std::string::npos) return Error("escapes in strings are not supported");
    pos_ = end + 1;
    return s;
  }

  absl::StatusOr<std::vector<int64_t>> ParseTuple() {
    std::vector<int64_t> ints;
    RETURN_IF_ERROR(Expect('('));
    SkipSpaces();
    bool trailing_comma = false;
    while (!Peek(')')) {
      if (pos_ >= text_.size() || text_[pos_] < '0' || text_[pos_] > '9') {
        return Error("shape entries must be non-negative integers");
      }
      int64_t n = 0;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
        const int digit = text_[pos_++] - '0';
        if (n > (std::numeric_limits<int64_t>::max() - digit) / 10) {
          return Error("a shape entry is too large");
        }
        n = n * 10 + digit;
      }
      ints.push_back(n);
      SkipSpaces();
      trailing_comma = Peek(',');
      if (trailing_comma) {
        ++pos_;
        SkipSpaces();
      } else if (!Peek(')')) {
        return Error("expected ',' or ')' in the shape");
      }
    }
    ++pos_;  // ')'
    // Python: (3) is the integer 3, only (3,) is a tuple.
    if (ints.size() == 1 && !trailing_comma) return Error("a 1-D shape is written (n,)");
    return ints;
  }

  void SkipSpaces() {
    while (pos_ < text_.size() && text_[pos_] == ' ') ++pos_;
  }
  bool Peek(char c) const { return pos_ < text_.size() && text_[pos_] == c; }
  absl::Status Expect(char c) {
    if (!Peek(c)) return Error(absl::StrCat("expected '", std::string(1, c), "'"));
    ++pos_;
    return absl::OkStatus();
  }
  absl::Status Error(const std::string& problem) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": bad .npy header at character ", pos_,
                                                   ": ", problem, " (header: ", text_, ")"));
  }

  absl::string_view text_;
  absl::string_view source_;
  size_t pos_ = 0;
};

absl::StatusOr<DType> ParseDescr(const std::string& descr, absl::string_view source) {
  if (descr == "<f4") return DType::kFloat32;
  if (descr == "<i4") return DType::kInt32;
  if (descr == "<i8") return DType::kInt64;
  return absl::UnimplementedError(
      absl::StrCat(source, ": .npy dtype '", descr,
                   "' is not supported (little-endian float32 '<f4', int32 '<i4' or int64 '<i8')"));
}

std::string Descr(DType dtype) {
  switch (dtype) {
    case DType::kInt32:
      return "<i4";
    case DType::kInt64:
      return "<i8";
    default:
      return "<f4";
  }
}

uint32_t ReadLittleEndian(absl::string_view bytes, size_t offset, size_t width) {
  uint32_t value = 0;
  for (size_t i = 0; i < width; ++i) {
    value |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[offset + i])) << (8 * i);
  }
  return value;
}

}  // namespace

int64_t NpyArray::numel() const { return NumElements(shape); }

absl::StatusOr<NpyArray> ParseNpy(absl::string_view bytes, absl::string_view source) {
  if (bytes.substr(0, kMagic.size()) != kMagic) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": not a .npy file (it does not start with \\x93NUMPY)"));
  }
  if (bytes.size() < 8) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": .npy file ends inside its preamble"));
  }
  const int major = static_cast<uint8_t>(bytes[6]);
  const int minor = static_cast<uint8_t>(bytes[7]);
  if (major < 1 || major > 3 || minor != 0) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": unsupported .npy format version ",
                                                   major, ".", minor, " (1.0, 2.0, 3.0 are)"));
  }
  const size_t len_width = major == 1 ? 2 : 4;
  const size_t header_start = 8 + len_width;
  if (bytes.size() < header_start) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": .npy file ends inside its preamble"));
  }
  const size_t header_len = ReadLittleEndian(bytes, 8, len_width);
  if (bytes.size() - header_start < header_len) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": .npy header claims ", header_len,
                                                   " bytes but the file has only ",
                                                   bytes.size() - header_start, " after it"));
  }
  absl::string_view header = bytes.substr(header_start, header_len);
  if (header.empty() || header.back() != '\n') {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": .npy header does not end with a newline"));
  }
  header.remove_suffix(1);
  ASSIGN_OR_RETURN(auto dict, HeaderParser(header, source).ParseDict());
  for (const auto& [key, value] : dict) {
    if (key != "descr" && key != "fortran_order" && key != "shape") {
      return absl::InvalidArgumentError(absl::StrCat(source, ": unexpected .npy header key '", key,
                                                     "' (expected descr, fortran_order, shape)"));
    }
  }
  for (const char* key : {"descr", "fortran_order", "shape"}) {
    if (!dict.contains(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": .npy header has no '", key, "' key"));
    }
  }
  const HeaderValue& descr = dict["descr"];
  const HeaderValue& fortran = dict["fortran_order"];
  const HeaderValue& shape = dict["shape"];
  if (descr.kind != HeaderValue::Kind::kString || fortran.kind != HeaderValue::Kind::kBool ||
      shape.kind != HeaderValue::Kind::kTuple) {
    return absl::InvalidArgumentError(absl::StrCat(
        source,
        ": .npy header wants a string descr, a True/False fortran_order and a tuple shape"));
  }
  NpyArray array;
  ASSIGN_OR_RETURN(array.dtype, ParseDescr(descr.text, source));
  array.shape = shape.ints;
  if (fortran.flag && array.shape.size() > 1) {
    return absl::UnimplementedError(
        absl::StrCat(source, ": Fortran-order arrays are not supported; save a C-order copy"));
  }
  // numel * element size, refusing to overflow on a hostile shape.
  const auto element = static_cast<int64_t>(DTypeSize(array.dtype));
  int64_t expected = element;
  for (int64_t d : array.shape) {
    if (d != 0 && expected > std::numeric_limits<int64_t>::max() / d) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": .npy shape (", absl::StrJoin(array.shape, ", "), ") is too large"));
    }
    expected *= d;
  }
  const size_t data_start = header_start + header_len;
  const auto actual = static_cast<int64_t>(bytes.size() - data_start);
  if (actual != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": .npy data is ", actual < expected ? "truncated" : "longer than its shape",
        ": shape (", absl::StrJoin(array.shape, ", "), ") of ", DTypeName(array.dtype), " needs ",
        expected, " bytes, the file has ", actual, " after the header"));
  }
  array.data.resize(static_cast<size_t>(expected));
  if (expected > 0) std::memcpy(array.data.data(), bytes.data() + data_start, array.data.size());
  return array;
}

absl::StatusOr<NpyArray> ReadNpyFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat(path, ": cannot open .npy file"));
  std::ostringstream contents;
  contents << file.rdbuf();
  if (file.bad()) return absl::DataLossError(absl::StrCat(path, ": error while reading"));
  return ParseNpy(contents.str(), path);
}

std::string EncodeNpy(DType dtype, const std::vector<int64_t>& shape,
                      std::span<const std::byte> data) {
  std::string shape_text =
      absl::StrCat("(", absl::StrJoin(shape, ", "), shape.size() == 1 ? ",)" : ")");
  std::string header = absl::StrCat("{'descr': '", Descr(dtype),
                                    "', 'fortran_order': False, 'shape': ", shape_text, ", }");
  // Pad with spaces so magic + version + length + header + '\n' is a multiple of 64.
  const size_t unpadded = kMagic.size() + 2 + 2 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::string out(kMagic);
  out.push_back('\x01');
  out.push_back('\x00');
  out.push_back(static_cast<char>(header.size() & 0xFF));
  out.push_back(static_cast<char>(header.size() >> 8));
  out += header;
  out.append(reinterpret_cast<const char*>(data.data()), data.size());
  return out;
}

absl::Status WriteNpyFile(const std::string& path, DType dtype, const std::vector<int64_t>& shape,
                          std::span<const std::byte> data) {
  const std::string bytes = EncodeNpy(dtype, shape, data);
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) return absl::NotFoundError(absl::StrCat(path, ": cannot create .npy file"));
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  file.close();
  if (!file) return absl::DataLossError(absl::StrCat(path, ": error while writing"));
  return absl::OkStatus();
}

}  // namespace flatshard::compute
