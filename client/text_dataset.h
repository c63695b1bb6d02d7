// `flatshard data prepare-text`: text files -> the token .npy files the FILE
// data source reads (worker/compute/npy_data_source.h), with a held-out split.
// The tokenizer is byte-level: a token is one byte of the UTF-8 text (vocab
// 256), so any text works, nothing is downloaded, and `flatshard generate`
// decodes exactly what the model predicts.
#ifndef FLATSHARD_CLIENT_TEXT_DATASET_H_
#define FLATSHARD_CLIENT_TEXT_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace flatshard {

inline constexpr int kByteVocabSize = 256;

// Token windows of one split: sample i is ids [i*T, (i+1)*T) of the split's
// byte stream, and its labels the same window one byte later (next-byte
// prediction, as GPT-2 trains).
struct TokenWindows {
  int64_t samples = 0;
  int64_t seq_len = 0;
  std::vector<int32_t> inputs;  // [samples, seq_len]
  std::vector<int32_t> labels;  // [samples, seq_len]
};

struct TextDataset {
  TokenWindows train;
  TokenWindows validation;
  int64_t bytes = 0;  // of text in all
};

// Splits `text` into the first (1 - validation_fraction) for training and the
// rest for validation (a held-out tail, so no window straddles both), each cut
// into windows of seq_len. INVALID_ARGUMENT naming the option when seq_len is
// not positive, the fraction is not in (0, 0.5], or the text is too short for
// one window in each split.
absl::StatusOr<TextDataset> MakeTextDataset(absl::string_view text, int64_t seq_len,
                                            double validation_fraction);

// Writes `dir`/train/{inputs,labels}.npy, `dir`/val/{inputs,labels}.npy (int32)
// and `dir`/tokenizer.json; creates `dir`.
absl::Status WriteTextDataset(const TextDataset& dataset, const std::string& dir);

// `text` with every run of spaces and tabs made one space: license and
// documentation text indents and centres with long runs, which a small model
// otherwise learns to repeat.
std::string SqueezeSpaces(absl::string_view text);

// Byte-level tokens of `text` and back.
std::vector<int32_t> EncodeBytes(absl::string_view text);
std::string DecodeBytes(const std::vector<int32_t>& ids);

}  // namespace flatshard

#endif  // FLATSHARD_CLIENT_TEXT_DATASET_H_
