// Writes one process's part of a safetensors file that several processes
// write at once: a FULL checkpoint's files, where every rank writes the
// elements its flat shard holds straight into place instead of gathering
// them to one writer (docs/checkpoints.md). Every writer is given the same
// slots and metadata, so all compute the same header and data offsets; the
// one told to writes the header. A writer's bytes go out in increasing file
// order and are hashed as they go, and Finish returns the byte ranges it
// wrote, each with its XXH3 (a manifest's CheckpointFile::regions), so each
// writer vouches for its own bytes and none reads another's.
#ifndef FLATSHARD_STORAGE_SAFETENSORS_REGION_WRITER_H_
#define FLATSHARD_STORAGE_SAFETENSORS_REGION_WRITER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "core/safetensors.h"
#include "storage/checkpoint_manifest.h"
#include "storage/file_system.h"

struct XXH3_state_s;

namespace flatshard {

class SafetensorsRegionWriter {
 public:
  // What one writer wrote of the file.
  struct Written {
    uint64_t file_bytes = 0;          // the whole file's size
    std::vector<FileRegion> regions;  // increasing, adjacent writes merged
  };

  // Opens `path` through `fs` (null: FileSystem::Default(), which must
  // outlive the writer), creating it at its full size if no other writer has
  // yet, and writes the header if `writes_header`.
  static absl::StatusOr<std::unique_ptr<SafetensorsRegionWriter>> Open(
      const std::string& path, const std::vector<SafetensorsSlot>& slots,
      const std::map<std::string, std::string>& metadata, bool writes_header,
      FileSystem* fs = nullptr);
  ~SafetensorsRegionWriter();
  SafetensorsRegionWriter(const SafetensorsRegionWriter&) = delete;
  SafetensorsRegionWriter& operator=(const SafetensorsRegionWriter&) = delete;

  // Elements [begin, begin + values.size()) of slot `name`, converted from
  // float32 to the slot's dtype. INVALID_ARGUMENT for an unknown name, a
  // range outside the slot, or a write behind one already made.
  absl::Status Write(absl::string_view name, uint64_t begin, std::span<const float> values);

  // fsyncs (every writer does: each makes its own bytes durable) and closes.
  absl::StatusOr<Written> Finish();

 private:
  struct Slot {
    uint64_t offset = 0;  // of its data in the file
    uint64_t numel = 0;
    DType dtype = DType::kFloat32;
  };
  SafetensorsRegionWriter(std::string path, std::unique_ptr<WritableFile> file,
                          std::map<std::string, Slot, std::less<>> slots, uint64_t file_bytes);
  absl::Status WriteAt(uint64_t offset, const char* data, size_t size);
  // Records the hash of the region being written, if any, and starts anew.
  void CloseRegion();

  std::string path_;
  std::unique_ptr<WritableFile> file_;
  std::map<std::string, Slot, std::less<>> slots_;
  Written written_;
  XXH3_state_s* hash_;
};

}  // namespace flatshard

#endif  // FLATSHARD_STORAGE_SAFETENSORS_REGION_WRITER_H_
