// ExchangeFlatRanges (worker/runtime/flat_range_exchange.h) between real
// processes over Gloo: every rank ends with exactly the elements it asked for,
// whichever members' shards they lie in (ranges crossing shard boundaries,
// ranges in the padding-free tail, ranges two ranks both want, a rank that
// wants nothing), and bad tables are refused on every rank before anything is
// sent.
#include "worker/runtime/flat_range_exchange.h"

#include <vector>

#include <gtest/gtest.h>

#include "tests/integration/multiprocess.h"
#include "worker/comm/file_store.h"
#include "worker/comm/gloo_communicator.h"

namespace flatshard {
namespace {

using testing::AllRanksSucceeded;
using testing::MakeTempDir;
using testing::RunRanks;

constexpr int kWorld = 3;
constexpr int64_t kNumel = 20;  // S = 7: the last shard holds 6 real elements
constexpr int64_t kShard = 7;

int Body(const std::string& dir, int rank) {
  auto store = FileStore::Open(dir);
  CHILD_OK(store.status());
  auto comm = GlooCommunicator::Create(*store, rank, kWorld, GlooOptions{});
  CHILD_OK(comm.status());
  // Rank r's shard of the flat value x -> 100 + x (padding: -1).
  std::vector<float> shard(kShard);
  for (int64_t i = 0; i < kShard; ++i) {
    const int64_t x = rank * kShard + i;
    shard[static_cast<size_t>(i)] = x < kNumel ? 100.0f + static_cast<float>(x) : -1.0f;
  }
  const std::vector<std::vector<FlatRange>> wanted = {
      {{0, 3}, {6, 15}},   // its own shard, then across ranks 0, 1 and 2
      {{2, 2}, {14, 19}},  // one element of rank 0, rank 2's whole real part
      {},                  // nothing
  };
  std::vector<float> out;
  CHILD_OK(ExchangeFlatRanges(**comm, shard, kNumel, wanted, out));
  CHILD_CHECK(out.size() == static_cast<size_t>(kNumel));
  for (const FlatRange& range : wanted[static_cast<size_t>(rank)]) {
    for (int64_t x = range.start; x <= range.end; ++x) {
      CHILD_CHECK(out[static_cast<size_t>(x)] == 100.0f + static_cast<float>(x));
    }
  }
  // Refused before any message: a table for another group size, and a range
  // past the flat value's end (every rank's own, so every rank refuses).
  const std::vector<std::vector<FlatRange>> short_table = {{{0, 1}}};
  CHILD_CHECK(ExchangeFlatRanges(**comm, shard, kNumel, short_table, out).code() ==
              absl::StatusCode::kInvalidArgument);
  const std::vector<std::vector<FlatRange>> past_end = {{{15, 20}}, {{15, 20}}, {{15, 20}}};
  CHILD_CHECK(ExchangeFlatRanges(**comm, shard, kNumel, past_end, out).code() ==
              absl::StatusCode::kInvalidArgument);
  // The group still works afterwards.
  CHILD_OK(ExchangeFlatRanges(**comm, shard, kNumel, wanted, out));
  return 0;
}

TEST(FlatRangeExchangeTest, EveryRankGetsExactlyItsRangesFromWhicheverShardsHoldThem) {
  const std::string dir = MakeTempDir("flat-range-exchange");
  auto results = RunRanks(
      kWorld, [&](int rank) { return Body(dir, rank); }, absl::Seconds(120));
  EXPECT_TRUE(AllRanksSucceeded(results));
}

}  // namespace
}  // namespace flatshard
