#include "rpc/checkpoint_file_proto.h"

namespace flatshard {

void CheckpointFileToProto(const CheckpointFile& file, v1::CheckpointFileInfo* out) {
  out->set_name(file.name);
  out->set_rank(file.rank);
  out->set_bytes(static_cast<int64_t>(file.bytes));
  out->set_xxh3(file.xxh3);
  for (const FileRegion& r : file.regions) {
    v1::FileRegionInfo* region = out->add_regions();
    region->set_offset(static_cast<int64_t>(r.offset));
    region->set_bytes(static_cast<int64_t>(r.bytes));
    region->set_xxh3(r.xxh3);
  }
}

CheckpointFile CheckpointFileFromProto(const v1::CheckpointFileInfo& info) {
  CheckpointFile file{
      info.name(), info.rank(), static_cast<uint64_t>(info.bytes()), info.xxh3(), {}};
  for (const v1::FileRegionInfo& r : info.regions()) {
    file.regions.push_back(
        {static_cast<uint64_t>(r.offset()), static_cast<uint64_t>(r.bytes()), r.xxh3()});
  }
  return file;
}

}  // namespace flatshard
