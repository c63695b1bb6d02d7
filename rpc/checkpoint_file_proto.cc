#include "rpc/checkpoint_file_proto.h"

namespace flatshard {

void CheckpointFileToProto(const CheckpointFile& file, v1::CheckpointFileInfo* out) {
  out->set_name(file.name);
  out->set_rank(file.rank);
  out->set_bytes(static_cast<int64_t>(file.bytes));
  out->set_xxh3(file.xxh3);
}

CheckpointFile CheckpointFileFromProto(const v1::CheckpointFileInfo& info) {
  return CheckpointFile{info.name(), info.rank(), static_cast<uint64_t>(info.bytes()), info.xxh3()};
}

}  // namespace flatshard
