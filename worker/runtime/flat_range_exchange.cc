#include "worker/runtime/flat_range_exchange.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace flatshard {
namespace {

// The parts of `wanted` that lie in `owner`'s shard, [owner*S, (owner+1)*S)
// clipped to the unpadded `numel`, in the order of `wanted`.
std::vector<FlatRange> Owned(const std::vector<FlatRange>& wanted, int owner, int64_t shard_numel,
                             int64_t numel) {
  const int64_t lo = static_cast<int64_t>(owner) * shard_numel;
  const int64_t hi = std::min(lo + shard_numel, numel);
  std::vector<FlatRange> parts;
  for (const FlatRange& range : wanted) {
    const int64_t begin = std::max(range.start, lo);
    const int64_t end = std::min(range.end + 1, hi);
    if (begin < end) parts.push_back({begin, end - 1});
  }
  return parts;
}

int64_t Total(const std::vector<FlatRange>& parts) {
  int64_t total = 0;
  for (const FlatRange& part : parts) total += part.numel();
  return total;
}

}  // namespace

absl::Status ExchangeFlatRanges(Communicator& comm, std::span<const float> shard, int64_t numel,
                                const std::vector<std::vector<FlatRange>>& wanted,
                                std::vector<float>& out) {
  const int world = comm.size();
  const int rank = comm.rank();
  if (wanted.size() != static_cast<size_t>(world)) {
    return absl::InvalidArgumentError(absl::StrCat("flat range exchange: ", wanted.size(),
                                                   " members' ranges for a group of ", world));
  }
  const auto s = static_cast<int64_t>(shard.size());
  for (const FlatRange& range : wanted[static_cast<size_t>(rank)]) {
    if (range.start < 0 || range.numel() < 0 || range.end >= numel) {
      return absl::InvalidArgumentError(absl::StrCat("flat range exchange: range [", range.start,
                                                     ", ", range.end, "] is outside the ", numel,
                                                     " elements"));
    }
  }
  out.resize(static_cast<size_t>(numel));
  const int64_t own_begin = static_cast<int64_t>(rank) * s;
  for (const FlatRange& part : Owned(wanted[static_cast<size_t>(rank)], rank, s, numel)) {
    std::copy_n(shard.begin() + (part.start - own_begin), part.numel(), out.begin() + part.start);
  }
  std::vector<float> sending, receiving;
  for (int k = 1; k < world; ++k) {
    const int to = (rank + k) % world;
    const int from = (rank - k + world) % world;
    sending.clear();
    for (const FlatRange& part : Owned(wanted[static_cast<size_t>(to)], rank, s, numel)) {
      sending.insert(sending.end(), shard.begin() + (part.start - own_begin),
                     shard.begin() + (part.end + 1 - own_begin));
    }
    const std::vector<FlatRange> incoming =
        Owned(wanted[static_cast<size_t>(rank)], from, s, numel);
    receiving.resize(static_cast<size_t>(Total(incoming)));
    if (absl::Status status =
            comm.SendRecv(sending.data(), sending.size() * sizeof(float), to, receiving.data(),
                          receiving.size() * sizeof(float), from);
        !status.ok()) {
      return status;
    }
    auto next = receiving.begin();
    for (const FlatRange& part : incoming) {
      std::copy_n(next, part.numel(), out.begin() + part.start);
      next += part.numel();
    }
  }
  return absl::OkStatus();
}

}  // namespace flatshard
