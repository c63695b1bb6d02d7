#include "worker/comm/gloo_communicator.h"

#include <algorithm>
#include <cstring>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "worker/comm/gloo_store_adapter.h"
#include "worker/comm/reduce_kernels.h"

namespace flatshard {
namespace {

std::chrono::milliseconds Millis(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// Gloo reports failures (a peer gone, a timeout, a bad argument) by throwing.
template <typename Fn>
absl::Status Guard(absl::string_view op, int rank, int size, Fn&& fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("gloo ", op, " failed on rank ", rank, " of ", size, ": ", e.what()));
  }
}

}  // namespace

GlooCommunicator::GlooCommunicator(std::shared_ptr<Store> store,
                                   std::shared_ptr<gloo::transport::Device> device,
                                   std::shared_ptr<gloo::Context> context, int rank, int size,
                                   GlooOptions options)
    : store_(std::move(store)),
      device_(std::move(device)),
      context_(std::move(context)),
      rank_(rank),
      size_(size),
      options_(std::move(options)) {}

GlooCommunicator::~GlooCommunicator() = default;

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(
    std::shared_ptr<Store> store, int rank, int size, const GlooOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo: rank ", rank, " is outside a group of size ", size));
  }
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
  absl::Status status = Guard("rendezvous", rank, size, [&] {
    gloo::transport::tcp::attr attr(options.hostname.c_str());
    device = gloo::transport::tcp::CreateDevice(attr);
    context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(Millis(options.timeout));
    GlooStoreAdapter adapter(store, options.prefix, options.timeout);
    context->connectFullMesh(adapter, device);
  });
  if (!status.ok()) return status;
  return std::unique_ptr<GlooCommunicator>(
      new GlooCommunicator(std::move(store), device, context, rank, size, options));
}

absl::Status GlooCommunicator::AllGather(const void* input, void* output, size_t count,
                                         DType dtype) {
  const size_t bytes = count * DTypeSize(dtype);
  if (size_ == 1) {
    if (input != output) std::memmove(output, input, bytes);
    return absl::OkStatus();
  }
  return Guard("all_gather", rank_, size_, [&] {
    gloo::AllgatherOptions opts(context_);
    auto* out = static_cast<uint8_t*>(output);
    if (input != out + static_cast<size_t>(rank_) * bytes) {
      opts.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(input)), bytes);
    }
    opts.setOutput(out, bytes * static_cast<size_t>(size_));
    opts.setTimeout(Millis(options_.timeout));
    gloo::allgather(opts);
  });
}

absl::Status GlooCommunicator::ReduceScatter(const void* input, void* output, size_t count,
                                             DType dtype) {
  const size_t es = DTypeSize(dtype);
  const size_t chunk = count * es;
  const size_t w = static_cast<size_t>(size_);
  if (size_ == 1) {
    std::memmove(output, input, chunk);
    return absl::OkStatus();
  }
  // Ring: at step s rank r sends its partial sum of chunk (r-s-1) to r+1 and adds
  // the partial sum of chunk (r-s-2) received from r-1; after W-1 steps chunk r is
  // complete. Every send is waited for before its buffer is touched again.
  // The working copy and the receive buffer persist across calls: FSDP reduces
  // the same sizes every step, and fresh pages would cost a fault each.
  std::vector<std::byte>& work = work_;
  work.resize(chunk * w);
  std::memcpy(work.data(), input, chunk * w);
  scratch_.resize(chunk);
  const int next = (rank_ + 1) % size_;
  const int prev = (rank_ + size_ - 1) % size_;
  return Guard("reduce_scatter", rank_, size_, [&] {
    auto work_buffer = context_->createUnboundBuffer(work.data(), work.size());
    auto recv_buffer = context_->createUnboundBuffer(scratch_.data(), chunk);
    const uint64_t base_slot = static_cast<uint64_t>(context_->nextSlot(size_));
    const auto timeout = Millis(options_.timeout);
    for (int s = 0; s < size_ - 1; ++s) {
      const size_t send_chunk = static_cast<size_t>((rank_ - s - 1 + 2 * size_) % size_);
      const size_t recv_chunk = static_cast<size_t>((rank_ - s - 2 + 2 * size_) % size_);
      const uint64_t slot = base_slot + static_cast<uint64_t>(s);
      work_buffer->send(next, slot, send_chunk * chunk, chunk);
      recv_buffer->recv(prev, slot, 0, chunk);
      if (!recv_buffer->waitRecv(timeout)) throw std::runtime_error("receive aborted");
      std::byte* acc = work.data() + recv_chunk * chunk;
      ReduceElements(dtype, ReduceOp::kSum, acc, scratch_.data(), acc, count);
      if (!work_buffer->waitSend(timeout)) throw std::runtime_error("send aborted");
    }
    std::memcpy(output, work.data() + static_cast<size_t>(rank_) * chunk, chunk);
  });
}

absl::Status GlooCommunicator::AllReduce(void* buffer, size_t count, DType dtype, ReduceOp op) {
  if (size_ == 1 || count == 0) return absl::OkStatus();
  const size_t es = DTypeSize(dtype);
  return Guard("all_reduce", rank_, size_, [&] {
    gloo::AllreduceOptions opts(context_);
    // The element type matters: Gloo's ring splits the buffer into per-rank
    // segments on element boundaries and passes element counts to the reduction.
    switch (es) {
      case 2:
        opts.setOutput(static_cast<uint16_t*>(buffer), count);
        break;
      case 4:
        opts.setOutput(static_cast<uint32_t*>(buffer), count);
        break;
      default:
        opts.setOutput(static_cast<uint64_t*>(buffer), count);
        break;
    }
    opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    opts.setReduceFunction([dtype, op](void* c, const void* a, const void* b, size_t n) {
      ReduceElements(dtype, op, a, b, c, n);
    });
    opts.setTimeout(Millis(options_.timeout));
    gloo::allreduce(opts);
  });
}

absl::Status GlooCommunicator::Broadcast(void* buffer, size_t count, DType dtype, int root) {
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast root ", root, " is outside a group of size ", size_));
  }
  if (size_ == 1 || count == 0) return absl::OkStatus();
  return Guard("broadcast", rank_, size_, [&] {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(static_cast<uint8_t*>(buffer), count * DTypeSize(dtype));
    opts.setRoot(root);
    opts.setTimeout(Millis(options_.timeout));
    gloo::broadcast(opts);
  });
}

absl::Status GlooCommunicator::Barrier() {
  if (size_ == 1) return absl::OkStatus();
  return Guard("barrier", rank_, size_, [&] {
    gloo::BarrierOptions opts(context_);
    opts.setTimeout(Millis(options_.timeout));
    gloo::barrier(opts);
  });
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
  absl::StatusOr<std::unique_ptr<GlooCommunicator>> sub =
      Create(store_, static_cast<int>(me - ranks.begin()), static_cast<int>(ranks.size()), options);
  if (!sub.ok()) return sub.status();
  return std::unique_ptr<Communicator>(std::move(*sub));
}

}  // namespace flatshard
