// GlooCommunicator's own ring collectives (gloo_communicator.h): the
// reduce-scatter that works in place on the caller's padded buffer and
// produces or consumes its chunks as it goes (ReduceScatterChunks), and the
// in-place all-gather. Gloo's built-in algorithms cannot be interrupted by
// an abort; these wait on ActiveBuffers, which can.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>

#include <gloo/rendezvous/context.h>

#include "worker/comm/gloo_active_buffer.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/reduce_kernels.h"

namespace flatshard {

void GlooCommunicator::RingReduceScatterInPlace(std::byte* data, size_t count, DType dtype,
                                                ReduceOp op, ReduceScatterChunks* chunks) {
  // Ring: at step s rank r sends its partial result of chunk (r-s-1) to r+1
  // and folds in the partial of chunk (r-s-2) received from r-1; after W-1
  // steps chunk r is complete. Every send is waited for before its chunk is
  // touched again. Each chunk is first touched exactly once (chunk r-1 by the
  // first send, every other by its reduction), which is where `chunks`
  // produces it; chunk r's reduction is the last step, where it is consumed.
  const size_t es = DTypeSize(dtype);
  const size_t chunk = count * es;
  scratch_.resize(chunk);
  const int next = (rank_ + 1) % size_;
  const int prev = (rank_ + size_ - 1) % size_;
  const auto first_send = static_cast<size_t>((rank_ - 1 + size_) % size_);
  const auto first_recv = static_cast<size_t>((rank_ - 2 + 2 * size_) % size_);
  // The first send straight from the caller's memory where it allows, so the
  // chunk is not copied (produced) first; its receiver finishes it.
  const std::byte* raw_send = chunks != nullptr ? chunks->RawChunk(first_send) : nullptr;
  const bool raw_recv = chunks != nullptr && chunks->RawChunk(first_recv) != nullptr;
  std::optional<ActiveBuffer> raw;
  if (raw_send != nullptr) {
    // Gloo's buffers take non-const memory; this one is only sent from.
    raw.emplace(*this, const_cast<std::byte*>(raw_send), chunk);
  } else if (chunks != nullptr) {
    chunks->Produce(first_send, 0, count, data + first_send * chunk);
  }
  ActiveBuffer work(*this, data, chunk * static_cast<size_t>(size_));
  ActiveBuffer received(*this, scratch_.data(), chunk);
  const auto base_slot = static_cast<uint64_t>(context_->nextSlot(size_));
  for (int s = 0; s < size_ - 1; ++s) {
    const auto send_chunk = static_cast<size_t>((rank_ - s - 1 + 2 * size_) % size_);
    const auto recv_chunk = static_cast<size_t>((rank_ - s - 2 + 2 * size_) % size_);
    const uint64_t slot = base_slot + static_cast<uint64_t>(s);
    ActiveBuffer& sending = s == 0 && raw.has_value() ? *raw : work;
    sending->send(next, slot, s == 0 && raw.has_value() ? 0 : send_chunk * chunk, chunk);
    received->recv(prev, slot, 0, chunk);
    received.WaitRecv();
    std::byte* acc = data + recv_chunk * chunk;
    const bool received_raw = s == 0 && raw_recv;
    if (chunks == nullptr) {
      ReduceElements(dtype, op, acc, scratch_.data(), acc, count);
    } else if (s < size_ - 2) {
      chunks->ProduceAndAdd(recv_chunk, 0, count, scratch_.data(), received_raw, acc);
    } else {
      // The result, a cache-sized block at a time, consumed while it is hot.
      // It goes through one reused block, not the work buffer: a copy there
      // would only be written back to memory, unread.
      constexpr size_t kBlockBytes = size_t{64} << 10;
      const size_t block = std::max<size_t>(1, kBlockBytes / es);
      result_block_.resize(std::min(block, count) * es);
      for (size_t begin = 0; begin < count; begin += block) {
        const size_t n = std::min(block, count - begin);
        chunks->ProduceAndAdd(recv_chunk, begin, n, scratch_.data() + begin * es, received_raw,
                              result_block_.data());
        chunks->Consume(begin, n, result_block_.data());
      }
    }
    sending.WaitSend();
  }
}

void GlooCommunicator::RingAllGatherInPlace(std::byte* data, size_t chunk) {
  // Ring: at step s rank r forwards chunk (r-s) to r+1 and receives chunk
  // (r-s-1) from r-1, straight into its place in the output.
  const int next = (rank_ + 1) % size_;
  const int prev = (rank_ + size_ - 1) % size_;
  ActiveBuffer out(*this, data, chunk * static_cast<size_t>(size_));
  const auto base_slot = static_cast<uint64_t>(context_->nextSlot(size_));
  for (int s = 0; s < size_ - 1; ++s) {
    const auto send_chunk = static_cast<size_t>((rank_ - s + size_) % size_);
    const auto recv_chunk = static_cast<size_t>((rank_ - s - 1 + 2 * size_) % size_);
    const uint64_t slot = base_slot + static_cast<uint64_t>(s);
    out->send(next, slot, send_chunk * chunk, chunk);
    out->recv(prev, slot, recv_chunk * chunk, chunk);
    out.WaitRecv();
    out.WaitSend();
  }
}

}  // namespace flatshard
