// The all-to-all a SHARDED checkpoint save needs: every member of a shard
// group holds its flat shard of a unit (elements [rank*S, (rank+1)*S) of the
// flat parameter, or of one optimizer state), and every member writes its own
// rows of each parameter, which lie in other members' shards. Each member
// sends each peer just the elements that peer writes, instead of all-gathering
// the whole flat value to everyone: a rank receives about 1/W of what an
// all-gather brings it.
#ifndef FLATSHARD_WORKER_RUNTIME_FLAT_RANGE_EXCHANGE_H_
#define FLATSHARD_WORKER_RUNTIME_FLAT_RANGE_EXCHANGE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"

#include "core/flat_param_layout.h"
#include "worker/comm/communicator.h"

namespace flatshard {

// Every member of `comm` calls it together. `shard` is this member's S
// elements (S the same on every member); `numel` the flat value's unpadded
// size; wanted[p] the ranges member p needs (the same table on every member;
// FlatRange is core's inclusive [start, end]).
// Afterwards out[x] for every x in this member's wanted ranges holds the flat
// value's element x (out has `numel` elements; the rest are unspecified).
// W-1 ring shifts (to r+k, from r-k), each carrying only wanted elements.
absl::Status ExchangeFlatRanges(Communicator& comm, std::span<const float> shard, int64_t numel,
                                const std::vector<std::vector<FlatRange>>& wanted,
                                std::vector<float>& out);

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_RUNTIME_FLAT_RANGE_EXCHANGE_H_
