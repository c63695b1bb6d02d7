#include "worker/compute/npy_data_source.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "core/status_macros.h"
#include "worker/compute/npy.h"

namespace flatshard::compute {
namespace {

std::string ShapeText(const NpyArray& a) {
  return absl::StrCat("(", absl::StrJoin(a.shape, ", "), ")");
}

absl::Status FileError(const std::string& file, const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat(file, ": ", problem));
}

std::vector<float> Floats(const NpyArray& a) {
  std::vector<float> out(static_cast<size_t>(a.numel()));
  if (!out.empty()) std::memcpy(out.data(), a.data.data(), out.size() * sizeof(float));
  return out;
}

// int32/int64 values as int32, each in [0, bound) (bound <= 0: [0, 2^31)).
absl::StatusOr<std::vector<int32_t>> Ids(const NpyArray& a, const std::string& file, int64_t bound,
                                         const char* bound_name) {
  if (a.dtype != DType::kInt32 && a.dtype != DType::kInt64) {
    return FileError(file,
                     absl::StrCat("must hold int32 or int64 values, not ", DTypeName(a.dtype)));
  }
  const int64_t limit = bound > 0 ? bound : int64_t{std::numeric_limits<int32_t>::max()} + 1;
  std::vector<int32_t> out(static_cast<size_t>(a.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t v = 0;
    if (a.dtype == DType::kInt32) {
      int32_t v32 = 0;
      std::memcpy(&v32, a.data.data() + i * 4, 4);
      v = v32;
    } else {
      std::memcpy(&v, a.data.data() + i * 8, 8);
    }
    if (v < 0 || v >= limit) {
      return FileError(
          file, absl::StrCat("value ", v, " at flat index ", i, " is outside [0, ", limit, ")",
                             bound > 0 ? absl::StrCat(" (", bound_name, ")") : ""));
    }
    out[i] = static_cast<int32_t>(v);
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<NpyDataSource>> NpyDataSource::Open(
    const DataSourceOptions& options) {
  if (options.path.empty()) {
    return absl::InvalidArgumentError(
        "npy data set: path (the directory of .npy files) is required");
  }
  if (options.global_batch_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "npy data set: global_batch_size must be > 0, got ", options.global_batch_size));
  }
  const std::filesystem::path dir(options.path);
  const std::string inputs_file = (dir / "inputs.npy").string();
  const std::string targets_file = (dir / "targets.npy").string();
  const std::string labels_file = (dir / "labels.npy").string();
  const bool has_targets = std::filesystem::exists(targets_file);
  const bool has_labels = std::filesystem::exists(labels_file);
  if (has_targets == has_labels) {
    return absl::InvalidArgumentError(
        absl::StrCat("npy data set ", options.path,
                     ": needs exactly one of targets.npy (MSE) and labels.npy "
                     "(cross-entropy), found ",
                     has_targets ? "both" : "neither"));
  }
  ASSIGN_OR_RETURN(const NpyArray inputs, ReadNpyFile(inputs_file));

  std::unique_ptr<NpyDataSource> source(new NpyDataSource());
  source->batch_ = options.global_batch_size;
  source->tokens_ = inputs.dtype != DType::kFloat32;
  if (inputs.shape.empty() || inputs.shape[0] == 0) {
    return FileError(inputs_file,
                     absl::StrCat("needs at least one sample, shape is ", ShapeText(inputs)));
  }
  source->samples_ = inputs.shape[0];
  if (source->tokens_) {
    if (inputs.shape.size() != 2) {
      return FileError(inputs_file, absl::StrCat("token ids must be [N, seq_len], got shape ",
                                                 ShapeText(inputs)));
    }
    source->width_ = inputs.shape[1];
    if (options.seq_len > 1 && options.seq_len != source->width_) {
      return FileError(inputs_file, absl::StrCat("holds sequences of ", source->width_,
                                                 " tokens but seq_len is ", options.seq_len));
    }
    ASSIGN_OR_RETURN(source->ids_, Ids(inputs, inputs_file, options.vocab_size, "vocab_size"));
  } else {
    if (inputs.shape.size() > 2) {
      return FileError(inputs_file, absl::StrCat("dense inputs must be [N, F] or [N], got shape ",
                                                 ShapeText(inputs)));
    }
    source->width_ = inputs.shape.size() == 2 ? inputs.shape[1] : 1;
    if (options.input_features > 0 && options.input_features != source->width_) {
      return FileError(inputs_file, absl::StrCat("has ", source->width_,
                                                 " features per sample but input_features is ",
                                                 options.input_features));
    }
    source->inputs_ = Floats(inputs);
  }

  const std::string& target_file = has_targets ? targets_file : labels_file;
  ASSIGN_OR_RETURN(const NpyArray target, ReadNpyFile(target_file));
  if (target.shape.empty() || target.shape[0] != source->samples_) {
    return FileError(target_file, absl::StrCat("has shape ", ShapeText(target), " but ",
                                               inputs_file, " has ", source->samples_, " samples"));
  }
  if (has_targets) {
    source->loss_ = LossKind::kMse;
    if (source->tokens_ || target.dtype != DType::kFloat32 || target.shape.size() > 2) {
      return FileError(target_file, "MSE targets must be float32 [N, O] or [N] for float32 inputs");
    }
    source->target_width_ = target.shape.size() == 2 ? target.shape[1] : 1;
    if (options.output_features > 0 && options.output_features != source->target_width_) {
      return FileError(target_file, absl::StrCat("has ", source->target_width_,
                                                 " outputs per sample but output_features is ",
                                                 options.output_features));
    }
    source->targets_ = Floats(target);
  } else {
    source->loss_ = LossKind::kCrossEntropy;
    const std::vector<int64_t> want = source->tokens_
                                          ? std::vector<int64_t>{source->samples_, source->width_}
                                          : std::vector<int64_t>{source->samples_};
    if (target.shape != want) {
      return FileError(target_file,
                       absl::StrCat("labels must have shape (", absl::StrJoin(want, ", "),
                                    ") to match the inputs, got ", ShapeText(target)));
    }
    source->target_width_ = source->tokens_ ? source->width_ : 1;
    const int64_t classes = source->tokens_ ? options.vocab_size : options.output_features;
    ASSIGN_OR_RETURN(source->labels_, Ids(target, target_file, classes,
                                          source->tokens_ ? "vocab_size" : "output_features"));
  }
  return source;
}

absl::StatusOr<Batch> NpyDataSource::GetBatch(int64_t step, int rank, int world_size) {
  ASSIGN_OR_RETURN(const SampleRange range, RankSamples(batch_, step, rank, world_size));
  Batch batch;
  batch.batch_size = range.size();
  batch.seq_len = tokens_ ? width_ : 1;
  const auto n = static_cast<size_t>(range.size());
  const auto w = static_cast<size_t>(width_);
  const auto tw = static_cast<size_t>(target_width_);
  if (tokens_) {
    batch.ids.resize(n * w);
  } else {
    batch.inputs = ZeroMatrix(range.size(), width_);
  }
  if (loss_ == LossKind::kMse) {
    batch.targets = ZeroMatrix(range.size(), target_width_);
  } else {
    batch.labels.resize(n * tw);
  }
  for (size_t i = 0; i < n; ++i) {
    // Steps cycle through the file: sample (global index) mod N.
    const auto s = static_cast<size_t>((range.begin + static_cast<int64_t>(i)) % samples_);
    if (tokens_) {
      std::copy_n(ids_.begin() + static_cast<std::ptrdiff_t>(s * w), w,
                  batch.ids.begin() + static_cast<std::ptrdiff_t>(i * w));
    } else {
      std::copy_n(inputs_.begin() + static_cast<std::ptrdiff_t>(s * w), w,
                  batch.inputs.values.begin() + static_cast<std::ptrdiff_t>(i * w));
    }
    if (loss_ == LossKind::kMse) {
      std::copy_n(targets_.begin() + static_cast<std::ptrdiff_t>(s * tw), tw,
                  batch.targets.values.begin() + static_cast<std::ptrdiff_t>(i * tw));
    } else {
      std::copy_n(labels_.begin() + static_cast<std::ptrdiff_t>(s * tw), tw,
                  batch.labels.begin() + static_cast<std::ptrdiff_t>(i * tw));
    }
  }
  return batch;
}

}  // namespace flatshard::compute
