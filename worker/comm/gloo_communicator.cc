#include "worker/comm/gloo_communicator.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <optional>
#include <string>

#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "core/status_payloads.h"
#include "worker/comm/gloo_active_buffer.h"
#include "worker/comm/gloo_mesh_context.h"
#include "worker/comm/gloo_store_adapter.h"
#include "worker/comm/reduce_kernels.h"

namespace flatshard {
namespace {

using gloo_internal::Millis;

template <typename Fn>
absl::Status RendezvousGuard(int rank, int size, Fn&& fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("gloo rendezvous failed on rank ", rank, " of ", size, ": ", e.what()));
  }
}

}  // namespace

GlooCommunicator::GlooCommunicator(std::shared_ptr<Store> store,
                                   std::shared_ptr<gloo::transport::Device> device,
                                   std::shared_ptr<GlooMeshContext> context, int rank, int size,
                                   GlooOptions options)
    : store_(std::move(store)),
      device_(std::move(device)),
      context_(std::move(context)),
      rank_(rank),
      size_(size),
      options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(
    std::shared_ptr<Store> store, int rank, int size, const GlooOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo: rank ", rank, " is outside a group of size ", size));
  }
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<GlooMeshContext> context;
  absl::Status status = RendezvousGuard(rank, size, [&] {
    gloo::transport::tcp::attr attr(options.hostname.c_str());
    device = gloo::transport::tcp::CreateDevice(attr);
    context = std::make_shared<GlooMeshContext>(rank, size);
    context->setTimeout(Millis(options.timeout));
    std::unique_ptr<AbortSignal::Registration> watch;
    if (options.abort != nullptr) {
      watch = options.abort->OnAbort(
          [mesh = context.get()](const std::string& reason) { mesh->Abort(reason); });
    }
    GlooStoreAdapter adapter(store, options.prefix, options.timeout);
    context->ConnectFullMesh(adapter, device);
  });
  if (!status.ok()) {
    // Aborted in the store (its hook may run before the mesh's) or in Gloo.
    if (options.abort != nullptr && options.abort->aborted()) {
      return absl::AbortedError(absl::StrCat("gloo rendezvous on rank ", rank, " of ", size,
                                             " aborted: ", options.abort->reason()));
    }
    // A pair that could not connect names its peer, in the world's ranks:
    // the coordinator decides whom that blames (either end, or neither).
    // (No context: the device could not be created, a hostname that does
    // not resolve, say.)
    if (const std::optional<int> peer =
            context != nullptr ? context->unreachable_peer() : std::nullopt;
        peer.has_value()) {
      const int world_peer = gloo_internal::WorldRank(options, *peer);
      return WithUnreachablePeer(
          absl::UnavailableError(absl::StrCat(status.message(), " (its pair to world rank ",
                                              world_peer, " did not connect)")),
          world_peer);
    }
    return status;
  }
  std::unique_ptr<GlooCommunicator> comm(
      new GlooCommunicator(std::move(store), device, context, rank, size, options));
  // For the communicator's life: the handshake below, and whatever its owner
  // still runs before it can be aborted otherwise (a runtime being built).
  if (options.abort != nullptr) {
    comm->abort_watch_ = options.abort->OnAbort(
        [raw = comm.get()](const std::string& reason) { raw->Abort(reason); });
  }
  // ConnectFullMesh returns on a rank once its own pairs are up, while a
  // peer may not yet have accepted its end of them.
  if (absl::Status ready = comm->ConfirmMesh(); !ready.ok()) {
    if (ready.code() == absl::StatusCode::kAborted) return ready;
    // UNAVAILABLE, and the peer it names (if any) kept.
    return PrefixStatus(absl::StrCat("gloo rendezvous failed on rank ", rank, " of ", size, ": "),
                        ready);
  }
  return comm;
}

absl::Status GlooCommunicator::AllGather(const void* input, void* output, size_t count,
                                         DType dtype) {
  const size_t bytes = count * DTypeSize(dtype);
  auto* out = static_cast<std::byte*>(output);
  std::byte* mine = out + static_cast<size_t>(rank_) * bytes;
  if (input != mine) std::memmove(mine, input, bytes);
  if (size_ == 1 || bytes == 0) return absl::OkStatus();
  return Guard("all_gather", [&] { RingAllGatherInPlace(out, bytes); });
}

absl::Status GlooCommunicator::ReduceScatter(const void* input, void* output, size_t count,
                                             DType dtype) {
  const size_t chunk = count * DTypeSize(dtype);
  if (size_ == 1) {
    std::memmove(output, input, chunk);
    return absl::OkStatus();
  }
  // The working copy persists across calls: FSDP reduces the same sizes every
  // step, and fresh pages would cost a fault each.
  work_.resize(chunk * static_cast<size_t>(size_));
  std::memcpy(work_.data(), input, work_.size());
  return Guard("reduce_scatter", [&] {
    RingReduceScatterInPlace(work_.data(), count, dtype, ReduceOp::kSum);
    std::memcpy(output, work_.data() + static_cast<size_t>(rank_) * chunk, chunk);
  });
}

absl::Status GlooCommunicator::ReduceScatterInPlace(void* buffer, size_t count, DType dtype) {
  if (size_ == 1) return absl::OkStatus();
  return Guard("reduce_scatter", [&] {
    RingReduceScatterInPlace(static_cast<std::byte*>(buffer), count, dtype, ReduceOp::kSum);
  });
}

absl::Status GlooCommunicator::ReduceScatterChunked(ReduceScatterChunks& chunks, void* work,
                                                    size_t count, DType dtype) {
  if (size_ == 1) return Communicator::ReduceScatterChunked(chunks, work, count, dtype);
  return Guard("reduce_scatter", [&] {
    RingReduceScatterInPlace(static_cast<std::byte*>(work), count, dtype, ReduceOp::kSum, &chunks);
  });
}

absl::Status GlooCommunicator::AllReduce(void* buffer, size_t count, DType dtype, ReduceOp op) {
  if (size_ == 1 || count == 0) return absl::OkStatus();
  // Reduce-scatter then all-gather (the bandwidth-optimal ring), over a copy
  // padded to a multiple of W elements; the padding reduces only with padding.
  const size_t es = DTypeSize(dtype);
  const size_t w = static_cast<size_t>(size_);
  const size_t chunk_count = (count + w - 1) / w;
  work_.assign(chunk_count * w * es, std::byte{0});
  std::memcpy(work_.data(), buffer, count * es);
  return Guard("all_reduce", [&] {
    RingReduceScatterInPlace(work_.data(), chunk_count, dtype, op);
    RingAllGatherInPlace(work_.data(), chunk_count * es);
    std::memcpy(buffer, work_.data(), count * es);
  });
}

absl::Status GlooCommunicator::Broadcast(void* buffer, size_t count, DType dtype, int root) {
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast root ", root, " is outside a group of size ", size_));
  }
  if (size_ == 1 || count == 0) return absl::OkStatus();
  const size_t bytes = count * DTypeSize(dtype);
  return Guard("broadcast", [&] {
    // The root sends to each rank directly: broadcasts are rare (module
    // states at start-up), so simplicity beats a pipelined tree.
    ActiveBuffer data(*this, buffer, bytes);
    const auto slot = static_cast<uint64_t>(context_->nextSlot());
    if (rank_ == root) {
      for (int peer = 0; peer < size_; ++peer) {
        if (peer != root) data->send(peer, slot);
      }
      for (int peer = 0; peer < size_; ++peer) {
        if (peer != root) data.WaitSend();
      }
    } else {
      data->recv(root, slot);
      data.WaitRecv();
    }
  });
}

absl::Status GlooCommunicator::Gather(const void* input, void* output, size_t count, DType dtype,
                                      int root) {
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("gather root ", root, " is outside a group of size ", size_));
  }
  const size_t bytes = count * DTypeSize(dtype);
  if (rank_ == root) {
    if (output == nullptr) return absl::InvalidArgumentError("gather: the root's output is null");
    auto* out = static_cast<std::byte*>(output);
    std::memmove(out + static_cast<size_t>(root) * bytes, input, bytes);
  }
  if (size_ == 1 || count == 0) return absl::OkStatus();
  return Guard("gather", [&] {
    // Every rank sends straight to the root, which receives them all at once
    // into their places (the root's link carries (W-1)/W of the tensor, as
    // each link of a ring all-gather does, but no other link carries any).
    const auto slot = static_cast<uint64_t>(context_->nextSlot());
    if (rank_ == root) {
      ActiveBuffer out(*this, output, bytes * static_cast<size_t>(size_));
      for (int peer = 0; peer < size_; ++peer) {
        if (peer != root) out->recv(peer, slot, static_cast<size_t>(peer) * bytes, bytes);
      }
      for (int peer = 0; peer < size_; ++peer) {
        if (peer != root) out.WaitRecv();
      }
    } else {
      // Gloo's buffers are not const; a send only reads it.
      ActiveBuffer in(*this, const_cast<void*>(input),
                      bytes);  // NOLINT(cppcoreguidelines-pro-type-const-cast)
      in->send(root, slot);
      in.WaitSend();
    }
  });
}

absl::Status GlooCommunicator::SendRecv(const void* send, size_t send_bytes, int to, void* recv,
                                        size_t recv_bytes, int from) {
  if (to < 0 || to >= size_ || from < 0 || from >= size_) {
    return absl::InvalidArgumentError(absl::StrCat("send_recv peers ", to, " and ", from,
                                                   " must be inside a group of size ", size_));
  }
  return Guard("send_recv", [&] {
    // Every rank takes one slot per call, so a ring shift's sends and
    // receives meet on the same slot.
    const auto slot = static_cast<uint64_t>(context_->nextSlot());
    if (to == rank_ && from == rank_) {
      std::memcpy(recv, send, std::min(send_bytes, recv_bytes));
      return;
    }
    std::optional<ActiveBuffer> in;
    std::optional<ActiveBuffer> out;
    if (recv_bytes > 0) {
      in.emplace(*this, recv, recv_bytes);
      (*in)->recv(from, slot);
    }
    if (send_bytes > 0) {
      // Gloo's unbound buffer is not const-correct: a send only reads it.
      // NOLINTNEXTLINE(cppcoreguidelines-pro-type-const-cast)
      out.emplace(*this, const_cast<void*>(send), send_bytes);
      (*out)->send(to, slot);
      out->WaitSend();
    }
    if (in.has_value()) in->WaitRecv();
  });
}

absl::Status GlooCommunicator::Barrier() {
  float token = 0.0f;
  return AllReduce(&token, 1, DType::kFloat32, ReduceOp::kSum);
}

absl::StatusOr<std::unique_ptr<Communicator>> GlooCommunicator::CreateSubgroup(
    const std::vector<int>& ranks, absl::string_view name) {
  auto me = std::find(ranks.begin(), ranks.end(), rank_);
  if (me == ranks.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "subgroup '", name, "' [", absl::StrJoin(ranks, ","), "] does not include rank ", rank_));
  }
  if (!std::is_sorted(ranks.begin(), ranks.end()) ||
      std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end() || ranks.front() < 0 ||
      ranks.back() >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("subgroup '", name, "' ranks [", absl::StrJoin(ranks, ","),
                     "] must be ascending, distinct, in [0, ", size_, ")"));
  }
  GlooOptions options = options_;
  options.prefix = absl::StrCat(options_.prefix, "/", name);
  options.world_ranks.clear();
  for (const int r : ranks) {
    options.world_ranks.push_back(
        options_.world_ranks.empty() ? r : options_.world_ranks[static_cast<size_t>(r)]);
  }
  absl::StatusOr<std::unique_ptr<GlooCommunicator>> sub =
      Create(store_, static_cast<int>(me - ranks.begin()), static_cast<int>(ranks.size()), options);
  if (!sub.ok()) return sub.status();
  return std::unique_ptr<Communicator>(std::move(*sub));
}

void GlooCommunicator::Abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (aborted_) return;
    aborted_ = true;
    abort_reason_ = reason;
    // Wakes this rank's waits, whatever peer they wait for.
    for (gloo::transport::UnboundBuffer* buffer : active_) {
      buffer->abortWaitRecv();
      buffer->abortWaitSend();
    }
  }
  // Resets the sockets, so peers blocked on this rank fail at once too.
  ClosePairs();
}

void GlooCommunicator::ClosePairs() {
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (!confirmed_) return;
  }
  // Pair::close takes the pair's lock, which its reads and completions hold:
  // once it returns, nothing more lands in any buffer. Idempotent.
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    auto& pair = context_->getPair(peer);
    if (pair != nullptr) pair->close();
  }
}

}  // namespace flatshard
