// A checkpoint file's manifest entry on the wire: what a worker reports for
// each file it wrote, and the coordinator records in the manifest.
#ifndef FLATSHARD_RPC_CHECKPOINT_FILE_PROTO_H_
#define FLATSHARD_RPC_CHECKPOINT_FILE_PROTO_H_

#include "flatshard/v1/worker.pb.h"
#include "storage/checkpoint_manifest.h"

namespace flatshard {

void CheckpointFileToProto(const CheckpointFile& file, v1::CheckpointFileInfo* out);
CheckpointFile CheckpointFileFromProto(const v1::CheckpointFileInfo& info);

}  // namespace flatshard

#endif  // FLATSHARD_RPC_CHECKPOINT_FILE_PROTO_H_
