#include "worker/comm/same_host_communicator.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <utility>

#include <sys/uio.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"

#include "core/status_macros.h"
#include "worker/comm/reduce_kernels.h"

namespace flatshard {
namespace {

// A peer's bytes are read a block at a time and added while still in cache.
constexpr size_t kBlockBytes = size_t{256} << 10;
// Whole copies go in pieces this size, so Abort() is seen between them.
constexpr size_t kCopyPiece = size_t{8} << 20;
// The fused gradient's sums go to the shard in pieces this size, each formed
// and consumed while it is still in L1.
constexpr size_t kConsumeBytes = size_t{16} << 10;

uint64_t AddressOf(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// Set on a published address whose raw chunks the readers finish
// (ReduceScatterChunked): no user-space address has its top bit set.
constexpr uint64_t kRawFlag = uint64_t{1} << 63;

// Probe outcomes besides an errno.
constexpr int64_t kReadAnotherProcess = -1;  // the token read back was not the peer's
constexpr int64_t kOptedOut = -2;            // SameHostOptions::enabled was false

// Reads `bytes` at `remote` in `pid` into `local`; errno of the failed call, or 0.
int ReadProcess(pid_t pid, uint64_t remote, void* local, size_t bytes) {
  auto* out = static_cast<std::byte*>(local);
  size_t done = 0;
  while (done < bytes) {
    iovec mine{out + done, bytes - done};
    // An address in the peer's memory, never dereferenced here.
    // NOLINTNEXTLINE(performance-no-int-to-ptr)
    iovec theirs{reinterpret_cast<void*>(remote + done), bytes - done};
    const ssize_t n = process_vm_readv(pid, &mine, 1, &theirs, 1, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EFAULT;  // nothing readable at the next byte
    done += static_cast<size_t>(n);
  }
  return 0;
}

absl::Status ReadError(int err, int peer, pid_t pid) {
  const std::string what =
      absl::StrCat("process_vm_readv from rank ", peer, " (pid ", pid, "): ", std::strerror(err));
  if (err == ESRCH) return absl::UnavailableError(absl::StrCat(what, "; the peer is gone"));
  if (err == EPERM) return absl::PermissionDeniedError(what);
  return absl::InternalError(what);
}

// The elements [begin, begin + len) rank `p` of `world` reduces in an
// all-reduce of `count`.
std::pair<size_t, size_t> RangeOf(int p, int world, size_t count) {
  const size_t chunk = (count + static_cast<size_t>(world) - 1) / static_cast<size_t>(world);
  const size_t begin = std::min(count, static_cast<size_t>(p) * chunk);
  return {begin, std::min(count, begin + chunk) - begin};
}

}  // namespace

SameHostCommunicator::SameHostCommunicator(std::unique_ptr<Communicator> inner,
                                           std::vector<pid_t> pids, SameHostOptions options)
    : inner_(std::move(inner)), pids_(std::move(pids)), options_(options) {}

absl::StatusOr<std::unique_ptr<Communicator>> SameHostCommunicator::Wrap(
    std::unique_ptr<Communicator> inner, const SameHostOptions& options, std::string* why_not) {
  const int world = inner->size();
  const int rank = inner->rank();
  if (why_not != nullptr) why_not->clear();
  if (world == 1) {
    if (why_not != nullptr) *why_not = "a group of one rank has no peer to read";
    return inner;
  }
  // What each rank publishes: its pid, and where a random token lies in its
  // memory. A rank that reads the token back is reading the right process
  // (not a namesake pid in another PID namespace or on another host).
  const auto token = std::make_unique<uint64_t>(
      ((uint64_t{std::random_device{}()} << 32) ^ std::random_device{}()) | 1);
  // And its min_bytes: every rank must send a collective down the same path.
  const std::vector<int64_t> mine = {getpid(), static_cast<int64_t>(AddressOf(token.get())),
                                     static_cast<int64_t>(*token),
                                     static_cast<int64_t>(options.min_bytes)};
  std::vector<int64_t> all(mine.size() * static_cast<size_t>(world));
  RETURN_IF_ERROR(inner->AllGather(mine.data(), all.data(), mine.size(), DType::kInt64));
  // {reason, peer}: 0, errno of the first failed read of `peer`,
  // kReadAnotherProcess, or kOptedOut. An opted-out rank still takes part in
  // both exchanges, so every rank agrees whatever each one's options say.
  std::vector<int64_t> result = {0, 0};
  if (!options.enabled) result = {kOptedOut, rank};
  std::vector<pid_t> pids(static_cast<size_t>(world));
  SameHostOptions agreed = options;
  for (int p = 0; p < world; ++p) {
    const auto* peer = &all[static_cast<size_t>(p) * mine.size()];
    pids[static_cast<size_t>(p)] = static_cast<pid_t>(peer[0]);
    // The largest threshold any rank asked for, so that a collective one rank
    // sends to Gloo's ring no rank sends down the same-host path.
    agreed.min_bytes = std::max(agreed.min_bytes, static_cast<size_t>(peer[3]));
    if (p == rank || result[0] != 0) continue;
    uint64_t seen = 0;
    int64_t reason = ReadProcess(static_cast<pid_t>(peer[0]), static_cast<uint64_t>(peer[1]), &seen,
                                 sizeof(seen));
    if (reason == 0 && seen != static_cast<uint64_t>(peer[2])) reason = kReadAnotherProcess;
    if (reason != 0) result = {reason, p};
  }
  // Also the barrier that keeps every token alive until all have been read.
  std::vector<int64_t> results(result.size() * static_cast<size_t>(world));
  RETURN_IF_ERROR(inner->AllGather(result.data(), results.data(), result.size(), DType::kInt64));
  for (int r = 0; r < world; ++r) {
    const int64_t reason = results[2 * static_cast<size_t>(r)];
    const int64_t peer = results[2 * static_cast<size_t>(r) + 1];
    if (reason == 0) continue;
    if (why_not != nullptr) {
      if (reason == kOptedOut) {
        *why_not = absl::StrCat("rank ", r,
                                " opted out (--no-same-host-copies, or a cuda device's pinned "
                                "buffers)");
      } else if (reason == kReadAnotherProcess) {
        *why_not = absl::StrCat("rank ", r, " cannot read rank ", peer,
                                "'s memory: its pid is another process here (another host or "
                                "PID namespace)");
      } else {
        *why_not =
            absl::StrCat("rank ", r, " cannot read rank ", peer,
                         "'s memory (process_vm_readv: ", std::strerror(static_cast<int>(reason)),
                         "): another host or PID namespace, or ptrace not permitted");
      }
    }
    return inner;
  }
  return std::unique_ptr<Communicator>(
      new SameHostCommunicator(std::move(inner), std::move(pids), agreed));
}

absl::StatusOr<std::vector<uint64_t>> SameHostCommunicator::ExchangeAddresses(const void* address) {
  return Exchange(AddressOf(address));
}

absl::StatusOr<std::vector<uint64_t>> SameHostCommunicator::Exchange(uint64_t value) {
  // Dissemination (Hensgen, Finkel and Manber's barrier, carrying data): in
  // round k each rank sends what it has to rank r + 2^k and hears from
  // r - 2^k, who by then has the values of ranks r - 2^k - j, j < 2^k. After
  // ceil(log2 W) rounds every rank has every value and knows that every rank
  // has entered: one hop at W=2, two at W=4, where the inner ring all-gather
  // takes W-1 hops and its barrier (a ring all-reduce) 2(W-1).
  const int world = size();
  const int me = rank();
  std::vector<uint64_t> all(static_cast<size_t>(world)), received(all.size());
  all[static_cast<size_t>(me)] = value;
  for (int dist = 1; dist < world; dist *= 2) {
    RETURN_IF_ERROR(inner_->SendRecv(all.data(), all.size() * sizeof(uint64_t), (me + dist) % world,
                                     received.data(), received.size() * sizeof(uint64_t),
                                     (me - dist + world) % world));
    for (int j = dist; j < std::min(2 * dist, world); ++j) {
      const auto from = static_cast<size_t>((me - j + world) % world);
      all[from] = received[from];
    }
  }
  return all;
}

absl::Status SameHostCommunicator::Barrier() { return ExchangeAddresses(nullptr).status(); }

absl::Status SameHostCommunicator::Fail(absl::Status status) {
  inner_->Abort(std::string(status.message()));
  aborted_.store(true);
  return status;
}

absl::Status SameHostCommunicator::ReadPeer(int peer, uint64_t remote, void* local, size_t bytes) {
  auto* out = static_cast<std::byte*>(local);
  for (size_t done = 0; done < bytes; done += kCopyPiece) {
    if (aborted_.load(std::memory_order_relaxed)) {
      // The inner communicator holds the reason and refuses with it.
      absl::Status refused = Barrier();
      return refused.ok() ? absl::AbortedError("collective aborted") : refused;
    }
    const size_t n = std::min(kCopyPiece, bytes - done);
    const pid_t pid = pids_[static_cast<size_t>(peer)];
    if (const int err = ReadProcess(pid, remote + done, out + done, n); err != 0) {
      return Fail(ReadError(err, peer, pid));
    }
  }
  return absl::OkStatus();
}

absl::Status SameHostCommunicator::ReduceFromPeers(const std::vector<uint64_t>& remotes,
                                                   size_t offset, const std::byte* own,
                                                   std::byte* acc, size_t count, DType dtype,
                                                   ReduceOp op, const ChunkSums* sums) {
  // The Gloo ring's association, so that either path gives the same bits:
  // chunk r ends as v_r + (v_{r-1} + (... + (v_{r+2} + v_{r+1}))), each
  // addition rounded in the dtype (a + b and b + a round alike). The peers'
  // partial sum is formed in sum_ (in cache), then this rank's value is added,
  // by ProduceAndAdd when the chunks are FSDP's gradient.
  const size_t es = DTypeSize(dtype);
  const size_t block = std::max<size_t>(1, kBlockBytes / es);
  block_.resize(block * es);
  sum_.resize(block * es);
  const int world = size();
  for (size_t begin = 0; begin < count; begin += block) {
    const size_t n = std::min(block, count - begin);
    for (int k = 1; k < world; ++k) {
      const int p = (rank() + k) % world;
      const uint64_t remote = remotes[static_cast<size_t>(p)] + offset + begin * es;
      std::byte* into = k == 1 ? sum_.data() : block_.data();
      RETURN_IF_ERROR(ReadPeer(p, remote, into, n * es));
      if (sums != nullptr && !sums->finish_on_read.empty() &&
          sums->finish_on_read[static_cast<size_t>(p)]) {
        sums->chunks->FinishRaw(static_cast<size_t>(rank()), begin, n, into);
      }
      if (k > 1) ReduceElements(dtype, op, sum_.data(), block_.data(), sum_.data(), n);
    }
    if (sums != nullptr) {
      // The peers' sum is raw only when it is one peer's raw chunk (W=2).
      // Consumed an L1-sized piece at a time, while the piece is in L1.
      const size_t piece = std::max<size_t>(1, kConsumeBytes / es);
      for (size_t b = 0; b < n; b += piece) {
        const size_t m = std::min(piece, n - b);
        sums->chunks->ProduceAndAdd(static_cast<size_t>(rank()), begin + b, m, sum_.data() + b * es,
                                    sums->received_raw, block_.data());
        sums->chunks->Consume(begin + b, m, block_.data());
      }
    } else {
      std::byte* a = acc + begin * es;
      ReduceElements(dtype, op, own != nullptr ? own + begin * es : a, sum_.data(), a, n);
    }
  }
  return absl::OkStatus();
}

absl::Status SameHostCommunicator::AllGather(const void* input, void* output, size_t count,
                                             DType dtype) {
  const size_t bytes = count * DTypeSize(dtype);
  if (Inner(bytes * static_cast<size_t>(size()))) {
    return inner_->AllGather(input, output, count, dtype);
  }
  ASSIGN_OR_RETURN(const std::vector<uint64_t> remotes, ExchangeAddresses(input));
  auto* out = static_cast<std::byte*>(output);
  std::byte* own = out + static_cast<size_t>(rank()) * bytes;
  if (own != input) std::memcpy(own, input, bytes);
  for (int k = 1; k < size(); ++k) {
    const int p = (rank() + k) % size();
    RETURN_IF_ERROR(
        ReadPeer(p, remotes[static_cast<size_t>(p)], out + static_cast<size_t>(p) * bytes, bytes));
  }
  return Barrier();  // every peer has read this rank's input
}

absl::Status SameHostCommunicator::ReduceScatter(const void* input, void* output, size_t count,
                                                 DType dtype) {
  if (Inner(count * DTypeSize(dtype) * static_cast<size_t>(size()))) {
    return inner_->ReduceScatter(input, output, count, dtype);
  }
  return ReduceOwnChunk(input, output, count, dtype);
}

absl::Status SameHostCommunicator::ReduceScatterInPlace(void* buffer, size_t count, DType dtype) {
  const size_t bytes = count * DTypeSize(dtype);
  if (Inner(bytes * static_cast<size_t>(size()))) {
    return inner_->ReduceScatterInPlace(buffer, count, dtype);
  }
  // Peers read only their own chunks of this buffer, which this rank leaves
  // alone; it writes only its own.
  return ReduceOwnChunk(
      buffer, static_cast<std::byte*>(buffer) + static_cast<size_t>(rank()) * bytes, count, dtype);
}

absl::Status SameHostCommunicator::ReduceOwnChunk(const void* input, void* output, size_t count,
                                                  DType dtype) {
  ASSIGN_OR_RETURN(const std::vector<uint64_t> remotes, ExchangeAddresses(input));
  const size_t offset = static_cast<size_t>(rank()) * count * DTypeSize(dtype);
  RETURN_IF_ERROR(ReduceFromPeers(remotes, offset, static_cast<const std::byte*>(input) + offset,
                                  static_cast<std::byte*>(output), count, dtype, ReduceOp::kSum));
  return Barrier();
}

absl::Status SameHostCommunicator::ReduceScatterChunked(ReduceScatterChunks& chunks, void* work,
                                                        size_t count, DType dtype) {
  const size_t bytes = count * DTypeSize(dtype);
  if (Inner(bytes * static_cast<size_t>(size()))) {
    return inner_->ReduceScatterChunked(chunks, work, count, dtype);
  }
  auto* data = static_cast<std::byte*>(work);
  const auto r = static_cast<size_t>(rank());
  const auto world = static_cast<size_t>(size());
  // With two ranks the one chunk a peer reads may be the caller's own memory,
  // finished by the reader (RawChunk; both ranks answer alike for a chunk),
  // as the ring's first send is. With more, a raw chunk that already lies in
  // place in `work` (a float32 gradient reduced on its own padded buffer) is
  // left as it is and finished by its reader as it reads it; every other
  // chunk but this rank's is produced into `work` before the peers may read
  // it. A rank says which with kRawFlag on the address it publishes.
  ChunkSums sums;
  sums.chunks = &chunks;
  const bool send_raw = world == 2 && chunks.RawChunk(1 - r) != nullptr;
  sums.received_raw = world == 2 && chunks.RawChunk(r) != nullptr;
  uint64_t base = AddressOf(data);
  if (send_raw) {
    // Chunk c of the published base is then RawChunk(c) (unsigned arithmetic).
    base = AddressOf(chunks.RawChunk(1 - r)) - (1 - r) * bytes;
  } else {
    bool raw_in_place = world > 2;
    for (size_t c = 0; c < world && raw_in_place; ++c) {
      const std::byte* raw = chunks.RawChunk(c);
      raw_in_place = c == r || raw == nullptr || raw == data + c * bytes;
    }
    for (size_t c = 0; c < world; ++c) {
      if (c != r && !(raw_in_place && chunks.RawChunk(c) != nullptr)) {
        chunks.Produce(c, 0, count, data + c * bytes);
      }
    }
    if (raw_in_place) base |= kRawFlag;
  }
  ASSIGN_OR_RETURN(std::vector<uint64_t> remotes, Exchange(base));
  if (world > 2) {  // (at W=2 the base may wrap, as above, and carries no flag)
    const bool mine_raw = chunks.RawChunk(r) != nullptr;
    sums.finish_on_read.resize(world);
    for (size_t p = 0; p < world; ++p) {
      sums.finish_on_read[p] = mine_raw && (remotes[p] & kRawFlag) != 0;
      remotes[p] &= ~kRawFlag;
    }
  }
  RETURN_IF_ERROR(ReduceFromPeers(remotes, r * bytes, nullptr, data + r * bytes, count, dtype,
                                  ReduceOp::kSum, &sums));
  return Barrier();
}

absl::Status SameHostCommunicator::AllReduce(void* buffer, size_t count, DType dtype, ReduceOp op) {
  const size_t es = DTypeSize(dtype);
  if (Inner(count * es)) return inner_->AllReduce(buffer, count, dtype, op);
  auto* data = static_cast<std::byte*>(buffer);
  ASSIGN_OR_RETURN(const std::vector<uint64_t> remotes, ExchangeAddresses(buffer));
  // Each rank reduces its range, then reads the others' reduced ranges.
  const auto [begin, len] = RangeOf(rank(), size(), count);
  RETURN_IF_ERROR(ReduceFromPeers(remotes, begin * es, nullptr, data + begin * es, len, dtype, op));
  RETURN_IF_ERROR(Barrier());  // every range is reduced
  for (int k = 1; k < size(); ++k) {
    const int p = (rank() + k) % size();
    const auto [b, n] = RangeOf(p, size(), count);
    RETURN_IF_ERROR(ReadPeer(p, remotes[static_cast<size_t>(p)] + b * es, data + b * es, n * es));
  }
  return Barrier();
}

absl::Status SameHostCommunicator::Broadcast(void* buffer, size_t count, DType dtype, int root) {
  const size_t bytes = count * DTypeSize(dtype);
  if (Inner(bytes) || root < 0 || root >= size()) {
    return inner_->Broadcast(buffer, count, dtype, root);  // it names a bad root
  }
  ASSIGN_OR_RETURN(const std::vector<uint64_t> remotes, ExchangeAddresses(buffer));
  if (rank() != root) {
    RETURN_IF_ERROR(ReadPeer(root, remotes[static_cast<size_t>(root)], buffer, bytes));
  }
  return Barrier();
}

void SameHostCommunicator::Abort(const std::string& reason) {
  inner_->Abort(reason);
  aborted_.store(true);
}

absl::StatusOr<std::unique_ptr<Communicator>> SameHostCommunicator::CreateSubgroup(
    const std::vector<int>& ranks, absl::string_view name) {
  ASSIGN_OR_RETURN(std::unique_ptr<Communicator> sub, inner_->CreateSubgroup(ranks, name));
  std::vector<pid_t> pids;
  pids.reserve(ranks.size());
  for (int r : ranks) pids.push_back(pids_[static_cast<size_t>(r)]);
  return std::unique_ptr<Communicator>(
      new SameHostCommunicator(std::move(sub), std::move(pids), options_));
}

}  // namespace flatshard
