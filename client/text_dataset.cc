#include "client/text_dataset.h"

#include <cmath>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

#include "core/status_macros.h"
#include "storage/durable_file.h"
#include "worker/compute/npy.h"

namespace flatshard {
namespace {

TokenWindows Windows(absl::string_view stream, int64_t seq_len) {
  TokenWindows w;
  w.seq_len = seq_len;
  // One byte more than the inputs: the last window's last label.
  w.samples = (static_cast<int64_t>(stream.size()) - 1) / seq_len;
  const auto n = static_cast<size_t>(w.samples * seq_len);
  w.inputs.resize(n);
  w.labels.resize(n);
  for (size_t i = 0; i < n; ++i) {
    w.inputs[i] = static_cast<unsigned char>(stream[i]);
    w.labels[i] = static_cast<unsigned char>(stream[i + 1]);
  }
  return w;
}

absl::Status WriteSplit(const TokenWindows& w, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  const std::vector<int64_t> shape = {w.samples, w.seq_len};
  RETURN_IF_ERROR(compute::WriteNpyFile(absl::StrCat(dir, "/inputs.npy"), DType::kInt32, shape,
                                        std::as_bytes(std::span(w.inputs))));
  return compute::WriteNpyFile(absl::StrCat(dir, "/labels.npy"), DType::kInt32, shape,
                               std::as_bytes(std::span(w.labels)));
}

}  // namespace

absl::StatusOr<TextDataset> MakeTextDataset(absl::string_view text, int64_t seq_len,
                                            double validation_fraction) {
  if (seq_len <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("--seq-len must be > 0, got ", seq_len));
  }
  if (!(validation_fraction > 0.0 && validation_fraction <= 0.5)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--validation-fraction must be in (0, 0.5], got ", validation_fraction));
  }
  const auto bytes = static_cast<int64_t>(text.size());
  const auto train_bytes =
      static_cast<int64_t>(std::floor(static_cast<double>(bytes) * (1.0 - validation_fraction)));
  TextDataset dataset;
  dataset.bytes = bytes;
  dataset.train = Windows(text.substr(0, static_cast<size_t>(train_bytes)), seq_len);
  dataset.validation = Windows(text.substr(static_cast<size_t>(train_bytes)), seq_len);
  if (dataset.train.samples == 0 || dataset.validation.samples == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d bytes of text are too few for one window of --seq-len %d in each split "
                        "(validation fraction %g): give more text or a shorter --seq-len",
                        bytes, seq_len, validation_fraction));
  }
  return dataset;
}

absl::Status WriteTextDataset(const TextDataset& dataset, const std::string& dir) {
  RETURN_IF_ERROR(WriteSplit(dataset.train, absl::StrCat(dir, "/train")));
  RETURN_IF_ERROR(WriteSplit(dataset.validation, absl::StrCat(dir, "/val")));
  return WriteFileDurably(
      absl::StrCat(dir, "/tokenizer.json"),
      absl::StrCat("{\"kind\": \"bytes\", \"vocab_size\": ", kByteVocabSize, "}\n"));
}

std::string SqueezeSpaces(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    const bool blank = c == ' ' || c == '\t';
    if (blank && !out.empty() && out.back() == ' ') continue;
    out += blank ? ' ' : c;
  }
  return out;
}

std::vector<int32_t> EncodeBytes(absl::string_view text) {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string DecodeBytes(const std::vector<int32_t>& ids) {
  std::string text(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) text[i] = static_cast<char>(ids[i] & 0xff);
  return text;
}

}  // namespace flatshard
