// Job and model files read from the disk: core parses their text
// (core/job_spec_yaml.h, core/model_spec_yaml.h); this is where the text, and a
// job's `model: PATH`, come from a file.
#ifndef FLATSHARD_STORAGE_SPEC_FILES_H_
#define FLATSHARD_STORAGE_SPEC_FILES_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "core/model_spec.h"
#include "flatshard/v1/job.pb.h"

namespace flatshard {

// Reads a whole file; NOT_FOUND naming the path when it cannot be opened.
absl::StatusOr<std::string> ReadTextFile(const std::string& path);

// Reads and parses a model file (ParseModelSpec); NOT_FOUND when it cannot be
// opened.
absl::StatusOr<ModelSpec> LoadModelSpecFile(const std::string& path);

// ParseJobSpecWith, a `model: PATH` read from the disk: PATH resolved against
// `base_dir` when relative (an empty `base_dir` means the current directory).
// A model file that cannot be opened is NOT_FOUND.
absl::StatusOr<v1::JobSpec> ParseJobSpec(absl::string_view text, const std::string& source,
                                         const std::string& base_dir);

// Reads and parses a job file; a relative model path is resolved against the
// file's directory. NOT_FOUND when the file cannot be opened.
absl::StatusOr<v1::JobSpec> LoadJobSpecFile(const std::string& path);

}  // namespace flatshard

#endif  // FLATSHARD_STORAGE_SPEC_FILES_H_
