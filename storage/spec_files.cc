#include "storage/spec_files.h"

#include <filesystem>

#include "absl/strings/str_cat.h"

#include "core/job_spec_yaml.h"
#include "core/model_spec_yaml.h"
#include "core/status_macros.h"
#include "storage/durable_file.h"

namespace flatshard {

absl::StatusOr<std::string> ReadTextFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  // A job or model file the user named: one message whatever the OS said.
  if (!text.ok()) return absl::NotFoundError(absl::StrCat(path, ": cannot open the file"));
  return text;
}

absl::StatusOr<ModelSpec> LoadModelSpecFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
  return ParseModelSpec(text, path);
}

absl::StatusOr<v1::JobSpec> ParseJobSpec(absl::string_view text, const std::string& source,
                                         const std::string& base_dir) {
  return ParseJobSpecWith(text, source, [&](const std::string& path) {
    // operator/ keeps an absolute `path` as it is.
    return LoadModelSpecFile((std::filesystem::path(base_dir) / path).string());
  });
}

absl::StatusOr<v1::JobSpec> LoadJobSpecFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
  return ParseJobSpec(text, path, std::filesystem::path(path).parent_path().string());
}

}  // namespace flatshard
