// The collective interface the data plane uses (modelled on c10d's ProcessGroup):
// all-gather into one flat buffer, reduce-scatter (SUM) into a shard, all-reduce,
// broadcast and barrier over a fixed group of ranks, plus sub-groups for hybrid
// sharding. GlooCommunicator implements it over TCP for host memory;
// NcclCommunicator over NVLink/IB for device memory. Buffers are raw pointers in
// the communicator's memory space.
//
// Contract: every rank of the group issues the same collectives in the same order
// (the executor guarantees it by running command batches in (epoch, seq) order).
// A communicator is used by one thread at a time (the worker's communication
// lane). Errors, including a peer that vanished or a timeout, come back as a
// Status; after an error the communicator is unusable and must be recreated.
#ifndef FLATSHARD_WORKER_COMM_COMMUNICATOR_H_
#define FLATSHARD_WORKER_COMM_COMMUNICATOR_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "core/dtype.h"

namespace flatshard {

enum class ReduceOp { kSum, kMax };

// The input and output of Communicator::ReduceScatterChunked, chunk by chunk:
// the caller writes each chunk of the input where the collective first touches
// it and takes this rank's reduced chunk as the collective completes it, so
// its own element passes (FSDP's cast, pre-divide and pad before the
// reduction, post-divide and accumulate after it; docs/fsdp-semantics.md §3.2)
// ride on the collective's reads of those bytes instead of sweeping the whole
// buffer before and after it. Elements are [begin, begin + n) of chunk
// `chunk`, each chunk `count` elements of the collective's dtype. Called on the
// collective's thread; none may fail (the caller validated its buffers).
class ReduceScatterChunks {
 public:
  virtual ~ReduceScatterChunks() = default;
  // Chunk `chunk` of the input as bytes the collective may send unchanged
  // (count elements of the collective's dtype, in the caller's memory), or
  // null to have Produce write it. A chunk sent so reaches its receiver's
  // ProduceAndAdd with `received_raw` set, and that finishes what Produce
  // would have done to it (FSDP's pre-divide, an exact per-element operation
  // either side can apply): the first send then reads the caller's gradient
  // instead of a copy of it. A collective that reads peers' memory
  // (SameHostCommunicator at W >= 3) may instead have a reader finish it with
  // FinishRaw as it reads it. Either way its bytes must stay as they are, and
  // readable, until the collective returns. Every rank must answer alike for
  // a chunk.
  virtual const std::byte* RawChunk(size_t /*chunk*/) { return nullptr; }
  // out = the input's elements.
  virtual void Produce(size_t chunk, size_t begin, size_t n, std::byte* out) = 0;
  // Another rank's RawChunk(chunk) elements [begin, begin + n), read as they
  // were, finished in place: what that rank's Produce would have written.
  virtual void FinishRaw(size_t chunk, size_t begin, size_t n, std::byte* values) = 0;
  // out = the input's elements + received, as ReduceElements sums them (this
  // rank's value first; 16-bit types round after the addition). With
  // `received_raw`, `received` is the sending rank's RawChunk, not yet
  // produced.
  virtual void ProduceAndAdd(size_t chunk, size_t begin, size_t n, const std::byte* received,
                             bool received_raw, std::byte* out) = 0;
  // Elements [begin, begin + n) of this rank's reduced chunk.
  virtual void Consume(size_t begin, size_t n, const std::byte* reduced) = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Rank r's `count` elements of `input` land at output[r*count, (r+1)*count).
  // `output` holds size()*count elements; `input` may alias output + rank*count.
  virtual absl::Status AllGather(const void* input, void* output, size_t count, DType dtype) = 0;

  // `input` holds size()*count elements; rank r receives the elementwise SUM of
  // every rank's chunk r in `output` (count elements). Sums of 16-bit dtypes
  // round after every addition, as NCCL's do.
  virtual absl::Status ReduceScatter(const void* input, void* output, size_t count,
                                     DType dtype) = 0;

  // ReduceScatter in place (NCCL's in-place form): `buffer` holds size()*count
  // elements; afterwards this rank's chunk, buffer[rank*count, (rank+1)*count),
  // holds the SUM of every rank's chunk `rank`, and the other chunks are
  // scratch (unspecified). For a caller whose input is scratch anyway (FSDP's
  // padded gradient), it saves the out-of-place form's working copy.
  virtual absl::Status ReduceScatterInPlace(void* buffer, size_t count, DType dtype) = 0;

  // ReduceScatterInPlace of an input `chunks` produces, whose reduced chunk
  // `chunks` consumes (ReduceScatterChunks above). `work` holds size()*count
  // elements of scratch. This default produces every chunk, reduce-scatters
  // in place and consumes this rank's chunk; a ring folds the producing into
  // the first touch of each chunk and the consuming into its last reduction.
  virtual absl::Status ReduceScatterChunked(ReduceScatterChunks& chunks, void* work, size_t count,
                                            DType dtype);

  // In place over `count` elements.
  virtual absl::Status AllReduce(void* buffer, size_t count, DType dtype, ReduceOp op) = 0;

  // In place: every rank ends with root's `count` elements.
  virtual absl::Status Broadcast(void* buffer, size_t count, DType dtype, int root) = 0;

  // Rank r's `count` elements of `input` land at root's output[r*count,
  // (r+1)*count); only root's `output` (size()*count elements) is written,
  // other ranks may pass null. A FULL checkpoint's writer needs the whole
  // tensor, the others nothing: this moves 1/size() of an all-gather's bytes.
  virtual absl::Status Gather(const void* input, void* output, size_t count, DType dtype,
                              int root) = 0;

  virtual absl::Status Barrier() = 0;

  // Point to point: sends `send_bytes` from `send` to rank `to` and receives
  // `recv_bytes` into `recv` from rank `from`, and returns when both are done.
  // Every rank of the group calls it together (a ring shift: to = r + 1,
  // from = r - 1), as with the collectives, so their message slots agree; a
  // rank that only sends or only receives passes 0 bytes for the other half.
  virtual absl::Status SendRecv(const void* send, size_t send_bytes, int to, void* recv,
                                size_t recv_bytes, int from) = 0;

  // Makes every pending and future collective on this communicator fail
  // promptly with `reason` instead of waiting for a peer that will never come
  // (a rank died, the coordinator failed the step). Callable from any thread
  // while another is inside a collective, like c10d's ProcessGroup::abort().
  // The communicator is unusable afterwards.
  virtual void Abort(const std::string& reason) = 0;

  // A communicator over `ranks` (ranks of this group, ascending, including this
  // one). Only members call it, all with the same `ranks` and `name`; the new
  // rank is the position in `ranks`.
  virtual absl::StatusOr<std::unique_ptr<Communicator>> CreateSubgroup(
      const std::vector<int>& ranks, absl::string_view name) = 0;
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_COMM_COMMUNICATOR_H_
