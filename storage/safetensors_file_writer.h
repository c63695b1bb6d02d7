// Writes one safetensors file tensor by tensor, so a writer holding one FSDP
// unit at a time can still produce a single consolidated file: the header
// (every name, dtype and shape, known up front) goes first, then each tensor's
// data in the declared order. The file is fsynced by Finish, which returns its
// size and XXH3 checksum computed on the way out (no second read).
#ifndef FLATSHARD_STORAGE_SAFETENSORS_FILE_WRITER_H_
#define FLATSHARD_STORAGE_SAFETENSORS_FILE_WRITER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "core/dtype.h"
#include "core/safetensors.h"
#include "storage/durable_file.h"
#include "storage/file_system.h"

struct XXH3_state_s;

namespace flatshard {

class SafetensorsFileWriter {
 public:
  // Creates `path` (ALREADY_EXISTS if it does) and writes the header for
  // `slots`, whose data must then be appended in this order.
  // Writes through `fs` (null: FileSystem::Default()), which must outlive it.
  static absl::StatusOr<std::unique_ptr<SafetensorsFileWriter>> Create(
      const std::string& path, std::vector<SafetensorsSlot> slots,
      const std::map<std::string, std::string>& metadata = {}, FileSystem* fs = nullptr);
  ~SafetensorsFileWriter();  // an unfinished file is removed
  SafetensorsFileWriter(const SafetensorsFileWriter&) = delete;
  SafetensorsFileWriter& operator=(const SafetensorsFileWriter&) = delete;

  // The next elements of the slot being written (the first one not yet
  // whole), as float32 values converted to the slot's dtype: a tensor may
  // come in several parts (a save that asks for its abort between them),
  // and the next slot's begin once this one has all its elements.
  // INVALID_ARGUMENT for another slot's name or more elements than remain.
  absl::Status Append(absl::string_view name, std::span<const float> values);

  // fsyncs and closes. FAILED_PRECONDITION when slots are missing.
  absl::StatusOr<FileDigest> Finish();

 private:
  SafetensorsFileWriter(std::string path, FileSystem* fs, std::unique_ptr<WritableFile> file,
                        std::vector<SafetensorsSlot> slots);
  absl::Status Write(const char* data, size_t size);

  std::string path_;
  FileSystem* fs_;
  std::unique_ptr<WritableFile> file_;
  std::vector<SafetensorsSlot> slots_;
  size_t next_ = 0;            // the slot being written
  uint64_t next_written_ = 0;  // its elements written so far
  uint64_t bytes_ = 0;
  XXH3_state_s* hash_;
  bool finished_ = false;
};

// Writes SerializeSafetensors' bytes to `path` atomically and durably
// (WriteFileDurably: a temporary file, fsync, rename, the directory's fsync).
absl::Status WriteSafetensorsFile(const std::string& path,
                                  const std::map<std::string, SafetensorsTensor>& tensors,
                                  const std::map<std::string, std::string>& metadata = {});

}  // namespace flatshard

#endif  // FLATSHARD_STORAGE_SAFETENSORS_FILE_WRITER_H_
