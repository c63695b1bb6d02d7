#include "worker/comm/communicator.h"

#include "core/status_macros.h"

namespace flatshard {

absl::Status Communicator::ReduceScatterChunked(ReduceScatterChunks& chunks, void* work,
                                                size_t count, DType dtype) {
  const size_t bytes = count * DTypeSize(dtype);
  auto* data = static_cast<std::byte*>(work);
  for (size_t c = 0; c < static_cast<size_t>(size()); ++c) {
    chunks.Produce(c, 0, count, data + c * bytes);
  }
  RETURN_IF_ERROR(ReduceScatterInPlace(work, count, dtype));
  chunks.Consume(0, count, data + static_cast<size_t>(rank()) * bytes);
  return absl::OkStatus();
}

}  // namespace flatshard
