#include "worker/compute/data_source.h"

#include "absl/strings/str_cat.h"

#include "worker/compute/npy_data_source.h"
#include "worker/compute/teacher_data.h"
#include "worker/compute/token_data.h"

namespace flatshard::compute {

absl::StatusOr<DataKind> ParseDataKind(absl::string_view name) {
  if (name == "regression") return DataKind::kRegression;
  if (name == "classification") return DataKind::kClassification;
  if (name == "tokens") return DataKind::kTokens;
  if (name == "npy") return DataKind::kNpy;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown data set kind '", name, "' (expected regression, classification, tokens or npy)"));
}

absl::string_view DataKindName(DataKind kind) {
  switch (kind) {
    case DataKind::kRegression:
      return "regression";
    case DataKind::kClassification:
      return "classification";
    case DataKind::kTokens:
      return "tokens";
    case DataKind::kNpy:
      return "npy";
  }
  return "unknown";
}

absl::StatusOr<SampleRange> RankSamples(int64_t global_batch_size, int64_t step, int rank,
                                        int world_size) {
  if (world_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("world size ", world_size, " must be > 0"));
  }
  if (rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside [0, ", world_size, ")"));
  }
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("step ", step, " must be >= 0"));
  if (global_batch_size <= 0 || global_batch_size % world_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("global batch size ", global_batch_size,
                     " must be a positive multiple of the world size ", world_size));
  }
  const int64_t local = global_batch_size / world_size;
  const int64_t begin = step * global_batch_size + rank * local;
  return SampleRange{begin, begin + local};
}

absl::StatusOr<std::unique_ptr<DataSource>> MakeDataSource(const DataSourceOptions& options) {
  if (options.global_batch_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data set: global_batch_size must be > 0, got ", options.global_batch_size));
  }
  switch (options.kind) {
    case DataKind::kRegression:
      return TeacherDataSource::Create(options, TeacherDataSource::Task::kRegression);
    case DataKind::kClassification:
      return TeacherDataSource::Create(options, TeacherDataSource::Task::kClassification);
    case DataKind::kTokens:
      return TokenDataSource::Create(options);
    case DataKind::kNpy:
      return NpyDataSource::Open(options);
  }
  return absl::InvalidArgumentError("data set: unknown kind");
}

}  // namespace flatshard::compute
