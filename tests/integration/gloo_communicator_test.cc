// Collectives between real processes over Gloo/TCP on loopback, rendezvous through
// a FileStore: W in {2, 3, 4}, element counts not divisible by W, float32 /
// float64 / bfloat16, sub-groups, a timeout when a peer never arrives, and
// an abort that ends a rendezvous waiting for a peer that never connects.
#include "worker/comm/gloo_communicator.h"

#include <cmath>
#include <future>
#include <iostream>
#include <optional>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

#include "core/status_payloads.h"
#include "tests/integration/multiprocess.h"
#include "tests/integration/rendezvous_test_util.h"
#include "worker/comm/file_store.h"

namespace flatshard {
namespace {

using testing::AbsentPeerAddresses;
using testing::AllRanksSucceeded;
using testing::MakeTempDir;
using testing::RefusingPeerAddresses;
using testing::RunRanks;

// Distinct, exactly representable in bf16 for small magnitudes.
float Value(int rank, size_t i) { return static_cast<float>(rank * 3 + static_cast<int>(i % 17)); }

std::unique_ptr<GlooCommunicator> Connect(const std::string& dir, int rank, int world,
                                          absl::Duration timeout = absl::Seconds(30)) {
  auto store = FileStore::Open(dir);
  if (!store.ok()) return nullptr;
  GlooOptions options;
  options.timeout = timeout;
  auto comm = GlooCommunicator::Create(*store, rank, world, options);
  if (!comm.ok()) {
    std::cerr << "rank " << rank << ": " << comm.status() << "\n";
    return nullptr;
  }
  return *std::move(comm);
}

int CollectivesBody(const std::string& dir, int rank, int world) {
  auto comm = Connect(dir, rank, world);
  CHILD_CHECK(comm != nullptr);
  CHILD_CHECK(comm->rank() == rank && comm->size() == world);
  for (size_t count : {size_t{1}, size_t{7}, size_t{1001}, size_t{65537}}) {
    // All-gather: rank r's block lands at [r*count, (r+1)*count).
    std::vector<float> shard(count), gathered(count * static_cast<size_t>(world), -1.0f);
    for (size_t i = 0; i < count; ++i) shard[i] = Value(rank, i);
    CHILD_OK(comm->AllGather(shard.data(), gathered.data(), count, DType::kFloat32));
    for (int r = 0; r < world; ++r) {
      for (size_t i = 0; i < count; ++i) {
        CHILD_CHECK(gathered[static_cast<size_t>(r) * count + i] == Value(r, i));
      }
    }
    // In place: input aliases the output slot of this rank.
    std::vector<float> inplace(count * static_cast<size_t>(world), -1.0f);
    std::copy(shard.begin(), shard.end(),
              inplace.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(rank) * count));
    CHILD_OK(comm->AllGather(inplace.data() + static_cast<size_t>(rank) * count, inplace.data(),
                             count, DType::kFloat32));
    CHILD_CHECK(inplace == gathered);

    // Reduce-scatter: rank r gets sum over ranks of chunk r.
    std::vector<float> full(count * static_cast<size_t>(world));
    for (size_t i = 0; i < full.size(); ++i) full[i] = Value(rank, i) + 0.5f;
    std::vector<float> out(count, -1.0f);
    CHILD_OK(comm->ReduceScatter(full.data(), out.data(), count, DType::kFloat32));
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int r = 0; r < world; ++r) {
        want += Value(r, static_cast<size_t>(rank) * count + i) + 0.5f;
      }
      CHILD_CHECK(out[i] == want);
    }
    // The input is left untouched.
    CHILD_CHECK(full[0] == Value(rank, 0) + 0.5f);
    // Gather to the last rank: only it receives, every chunk in its place.
    const int root = world - 1;
    std::vector<float> at_root(rank == root ? count * static_cast<size_t>(world) : 0, -1.0f);
    CHILD_OK(comm->Gather(shard.data(), rank == root ? at_root.data() : nullptr, count,
                          DType::kFloat32, root));
    if (rank == root) CHILD_CHECK(at_root == gathered);
    CHILD_CHECK(comm->Gather(shard.data(), nullptr, count, DType::kFloat32, world).code() ==
                absl::StatusCode::kInvalidArgument);
    // In place: this rank's chunk of the buffer ends as the same sums.
    std::vector<float> work = full;
    CHILD_OK(comm->ReduceScatterInPlace(work.data(), count, DType::kFloat32));
    CHILD_CHECK(
        std::equal(out.begin(), out.end(),
                   work.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(rank) * count)));

    // Reduce-scatter in bf16 and float64.
    std::vector<uint16_t> bf(full.size()), bf_out(count);
    for (size_t i = 0; i < full.size(); ++i) bf[i] = FloatToBFloat16(full[i]);
    CHILD_OK(comm->ReduceScatter(bf.data(), bf_out.data(), count, DType::kBFloat16));
    for (size_t i = 0; i < count; ++i) CHILD_CHECK(BFloat16ToFloat(bf_out[i]) == out[i]);
    std::vector<double> d(full.begin(), full.end()), d_out(count);
    CHILD_OK(comm->ReduceScatter(d.data(), d_out.data(), count, DType::kFloat64));
    for (size_t i = 0; i < count; ++i) CHILD_CHECK(d_out[i] == static_cast<double>(out[i]));

    // All-reduce SUM and MAX.
    std::vector<float> sum(count), max(count);
    for (size_t i = 0; i < count; ++i) sum[i] = max[i] = Value(rank, i);
    CHILD_OK(comm->AllReduce(sum.data(), count, DType::kFloat32, ReduceOp::kSum));
    CHILD_OK(comm->AllReduce(max.data(), count, DType::kFloat32, ReduceOp::kMax));
    for (size_t i = 0; i < count; ++i) {
      float want_sum = 0, want_max = Value(0, i);
      for (int r = 0; r < world; ++r) {
        want_sum += Value(r, i);
        want_max = std::max(want_max, Value(r, i));
      }
      CHILD_CHECK(sum[i] == want_sum);
      CHILD_CHECK(max[i] == want_max);
    }

    // Broadcast from the last rank.
    std::vector<double> b(count, static_cast<double>(rank));
    CHILD_OK(comm->Broadcast(b.data(), count, DType::kFloat64, world - 1));
    for (double x : b) CHILD_CHECK(x == world - 1);
  }
  CHILD_OK(comm->Barrier());
  CHILD_CHECK(!comm->Broadcast(nullptr, 1, DType::kFloat32, world).ok());

  // Sub-groups: even and odd ranks, as hybrid sharding's groups are built.
  std::vector<int> members;
  for (int r = rank % 2; r < world; r += 2) members.push_back(r);
  auto sub = comm->CreateSubgroup(members, rank % 2 == 0 ? "even" : "odd");
  CHILD_OK(sub.status());
  CHILD_CHECK((*sub)->size() == static_cast<int>(members.size()));
  float mine = static_cast<float>(rank);
  CHILD_OK((*sub)->AllReduce(&mine, 1, DType::kFloat32, ReduceOp::kSum));
  float want = 0;
  for (int r : members) want += static_cast<float>(r);
  CHILD_CHECK(mine == want);
  CHILD_CHECK(!comm->CreateSubgroup({(rank + 1) % world}, "other").ok());
  return 0;
}

class GlooCollectivesTest : public ::testing::TestWithParam<int> {};

TEST_P(GlooCollectivesTest, AllCollectivesAgreeWithLocalArithmetic) {
  const int world = GetParam();
  const std::string dir = MakeTempDir("gloo");
  auto results = RunRanks(
      world, [&](int rank) { return CollectivesBody(dir, rank, world); }, absl::Seconds(120));
  EXPECT_TRUE(AllRanksSucceeded(results));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooCollectivesTest, ::testing::Values(2, 3, 4));

// A peer that never shows up: rendezvous fails with a clear error, no hang.
TEST(GlooCommunicatorTest, MissingPeerTimesOut) {
  const std::string dir = MakeTempDir("gloo-missing");
  auto results = RunRanks(
      1,
      [&](int) {
        auto store = FileStore::Open(dir);
        GlooOptions options;
        options.timeout = absl::Seconds(1);
        auto comm = GlooCommunicator::Create(*store, 0, 2, options);
        if (comm.ok()) return 1;
        const std::string message(comm.status().message());
        std::cerr << message << "\n";
        return message.find("rank 0 of 2") != std::string::npos ? 0 : 2;
      },
      absl::Seconds(30));
  EXPECT_TRUE(AllRanksSucceeded(results));
}

// c10d-style abort: a collective blocked on a peer that never joins returns
// ABORTED at once when another thread aborts the communicator, long before
// the collective timeout, and every later collective is refused the same way.
// The abort closes the aborter's connections, so a peer that then waits on it
// (rank 1 receives from rank 0 in the ring) fails promptly too, without
// aborting itself. Rank 1 enters its collective only after rank 0 aborted:
// entered earlier, it could receive rank 0's chunk before the abort and then
// block on rank 2 (which never joins) until the collective timeout; and of two
// concurrent aborts the winner of the race decides who sees ABORTED.
TEST(GlooCommunicatorTest, AbortWakesABlockedCollective) {
  const std::string dir = MakeTempDir("gloo-abort");
  auto results = RunRanks(
      3,
      [&](int rank) {
        auto comm = Connect(dir, rank, 3, absl::Seconds(120));
        CHILD_CHECK(comm != nullptr);
        auto store = FileStore::Open(dir);
        CHILD_OK(store.status());
        if (rank == 2) {  // joined the group, never joins the collective
          CHILD_OK((*store)->Wait({"done-0", "done-1"}, absl::Seconds(60)));
          return 0;
        }
        std::vector<float> shard(1000, 1.0f), gathered(3000);
        if (rank == 1) CHILD_OK((*store)->Wait({"aborted-0"}, absl::Seconds(60)));
        std::promise<void> started;
        absl::Status gather_status;
        const absl::Time begin = absl::Now();
        std::thread gather([&] {
          started.set_value();
          gather_status = comm->AllGather(shard.data(), gathered.data(), 1000, DType::kFloat32);
        });
        started.get_future().wait();
        if (rank == 0) {
          comm->Abort("rank 2 is gone");
          CHILD_OK((*store)->Set("aborted-0", "1"));
        }
        gather.join();
        const absl::Duration took = absl::Now() - begin;
        std::cerr << "rank " << rank << ": " << gather_status << " after " << took << "\n";
        CHILD_CHECK(took < absl::Seconds(20));
        if (rank == 0) {
          CHILD_CHECK(gather_status.code() == absl::StatusCode::kAborted);
          CHILD_CHECK(std::string(gather_status.message()).find("rank 2 is gone") !=
                      std::string::npos);
        } else {
          CHILD_CHECK(gather_status.code() == absl::StatusCode::kUnavailable);
          CHILD_CHECK(std::string(gather_status.message()).find("rank 1 of 3") !=
                      std::string::npos);
          comm->Abort("peer aborted");
        }
        float x = 1;
        CHILD_CHECK(comm->AllReduce(&x, 1, DType::kFloat32, ReduceOp::kSum).code() ==
                    absl::StatusCode::kAborted);
        CHILD_OK((*store)->Set(absl::StrCat("done-", rank), "1"));
        return 0;
      },
      absl::Seconds(60));
  EXPECT_TRUE(AllRanksSucceeded(results));
}

// The worker's case (a formation abandoned because one rank failed after it
// had published its addresses): the others wait in Gloo for it to connect,
// five rendezvous timeouts long, and hold their next configure back. Aborting
// the group's AbortSignal ends the wait at once with ABORTED naming the
// reason, on every rank, and before its rendezvous began on a rank that had
// not started it.
TEST(GlooCommunicatorTest, AbortEndsARendezvousWaitingForAPeerThatNeverConnects) {
  const std::string dir = MakeTempDir("gloo-abort-rendezvous");
  constexpr int kWorld = 3;  // ranks 0 and 1 are real; rank 2 published and left
  {
    auto store = FileStore::Open(dir);
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->Set("gloo/2", AbsentPeerAddresses(kWorld)).ok());
  }
  auto results = RunRanks(
      2,
      [&](int rank) {
        auto store = FileStore::Open(dir);
        CHILD_OK(store.status());
        GlooOptions options;
        options.timeout = absl::Seconds(60);  // Gloo waits five of these to connect
        options.abort = std::make_shared<AbortSignal>();
        absl::StatusOr<std::unique_ptr<GlooCommunicator>> comm;
        absl::Notification returned;
        std::thread rendezvous([&] {
          comm = GlooCommunicator::Create(*store, rank, kWorld, options);
          returned.Notify();
        });
        // Both real ranks have published: each is past the store, connecting.
        CHILD_OK((*store)->Wait({"gloo/0", "gloo/1"}, absl::Seconds(30)));
        // Still waiting for rank 2 a second later (it waits 300 s without an abort).
        CHILD_CHECK(!returned.WaitForNotificationWithTimeout(absl::Seconds(1)));
        const absl::Time begin = absl::Now();
        options.abort->Abort("rank 2's configure failed");
        rendezvous.join();
        const absl::Duration took = absl::Now() - begin;
        std::cerr << "rank " << rank << ": " << comm.status() << " " << took
                  << " after the abort\n";
        CHILD_CHECK(comm.status().code() == absl::StatusCode::kAborted);
        CHILD_CHECK(std::string(comm.status().message()).find("rank 2's configure failed") !=
                    std::string::npos);
        CHILD_CHECK(took < absl::Seconds(10));
        // A group created with an aborted signal fails before it connects anything.
        auto late = GlooCommunicator::Create(*store, rank, kWorld, options);
        CHILD_CHECK(late.status().code() == absl::StatusCode::kAborted);
        return 0;
      },
      absl::Seconds(90));
  EXPECT_TRUE(AllRanksSucceeded(results));
}

// A pair whose connection is refused fails the rendezvous at once, naming the
// peer it could not reach in the job's world ranks, which the coordinator
// blames as a link, not as the reporting rank's own failure.
TEST(GlooCommunicatorTest, ARefusedConnectionNamesThePeerItCouldNotReach) {
  const std::string dir = MakeTempDir("gloo-refused");
  auto results = RunRanks(
      1,
      [&](int) {
        auto store = FileStore::Open(dir);
        CHILD_OK(store.status());
        CHILD_OK((*store)->Set("world/1", RefusingPeerAddresses(2)));
        CHILD_OK((*store)->Set("sub/1", RefusingPeerAddresses(2)));
        GlooOptions options;
        options.timeout = absl::Seconds(60);
        options.prefix = "world";
        const absl::Time begin = absl::Now();
        auto comm = GlooCommunicator::Create(*store, 0, 2, options);
        std::cerr << comm.status() << " after " << absl::Now() - begin << "\n";
        CHILD_CHECK(comm.status().code() == absl::StatusCode::kUnavailable);
        CHILD_CHECK(UnreachablePeer(comm.status()) == std::optional<int>(1));
        CHILD_CHECK(
            absl::StrContains(comm.status().message(), "its pair to world rank 1 did not connect"));
        CHILD_CHECK(absl::Now() - begin < absl::Seconds(30));  // not a timeout
        // A sub-group names the peer by its rank in the world.
        options.prefix = "sub";
        options.world_ranks = {4, 9};
        auto sub = GlooCommunicator::Create(*store, 0, 2, options);
        CHILD_CHECK(UnreachablePeer(sub.status()) == std::optional<int>(9));
        return 0;
      },
      absl::Seconds(90));
  EXPECT_TRUE(AllRanksSucceeded(results));
}

// A pair that fails after its group connected (the peer's process ended,
// its sockets closed by the kernel, as at a SIGKILL) names that peer, in the
// job's world ranks, as a pair that did not connect does: in a formation
// the coordinator then blames the link, not the rank that reported it
// (coordinator/link_failures.h). Without the name, the reporting rank was
// blamed, and marked unreachable, for its peer's exit. Each rank leaves
// once. The one left behind is the pair's connecting side (its error names
// the address the peer published) or its accepting side (the peer's host
// and a port no one published), as the two ranks' ports fall
// (worker/comm/gloo_error_peer.h; both rules are tests/unit's too).
TEST(GlooCommunicatorTest, ALinkThatFailsAfterConnectingNamesItsPeer) {
  constexpr int kWorldRanks[] = {4, 9};  // a sub-group of the world
  for (const int leaving : {1, 0}) {
    const int staying = 1 - leaving;
    const std::string dir = MakeTempDir("gloo-link-failed");
    auto results = RunRanks(
        2,
        [&](int rank) {
          auto store = FileStore::Open(dir);
          CHILD_OK(store.status());
          GlooOptions options;
          options.timeout = absl::Seconds(60);
          options.world_ranks = {kWorldRanks[0], kWorldRanks[1]};
          auto comm = GlooCommunicator::Create(*store, rank, 2, options);
          CHILD_OK(comm.status());
          if (rank == leaving) {
            // Once the other is past the group's handshake too: nothing unread.
            CHILD_OK((*store)->Wait({"connected"}, absl::Seconds(30)));
            ::_exit(0);
          }
          CHILD_OK((*store)->Set("connected", "1"));
          std::vector<float> data(size_t{1} << 16, 1.0f);
          const absl::Time begin = absl::Now();
          const absl::Status failed =
              (*comm)->AllReduce(data.data(), data.size(), DType::kFloat32, ReduceOp::kSum);
          std::cerr << "rank " << rank << ": " << failed << " after " << absl::Now() - begin
                    << "\n";
          CHILD_CHECK(failed.code() == absl::StatusCode::kUnavailable);
          CHILD_CHECK(UnreachablePeer(failed) == std::optional<int>(kWorldRanks[leaving]));
          CHILD_CHECK(absl::StrContains(
              failed.message(),
              absl::StrCat("its link to world rank ", kWorldRanks[leaving], " failed")));
          CHILD_CHECK(absl::Now() - begin < absl::Seconds(30));  // not the timeout
          return 0;
        },
        absl::Seconds(90));
    EXPECT_TRUE(AllRanksSucceeded(results))
        << "rank " << leaving << " left, rank " << staying << " stayed";
  }
}

// An abort may land anywhere in a rendezvous of live ranks: before it, in the
// store, while a pair listens or connects, in the handshake. Every rank is
// aborted at once, as a worker's abort does (store and Gloo), after a delay
// swept over the rounds (0-38 ms, the time a W=3 rendezvous takes here).
// Whatever the abort catches, Create returns (OK once done, else ABORTED, or
// UNAVAILABLE where a peer's abort closed a pair first) and never takes the
// process down, as a connecting pair closed before Gloo's connect() would.
TEST(GlooCommunicatorTest, AnAbortAnywhereInTheRendezvousEndsItCleanly) {
  const std::string dir = MakeTempDir("gloo-abort-sweep");
  constexpr int kRounds = 20;
  auto results = RunRanks(
      3,
      [&](int rank) {
        for (int round = 0; round < kRounds; ++round) {
          auto store = FileStore::Open(dir);  // one per round: an aborted store stays aborted
          CHILD_OK(store.status());
          GlooOptions options;
          options.timeout = absl::Seconds(60);
          options.prefix = absl::StrCat("round", round);
          options.abort = std::make_shared<AbortSignal>();
          auto store_abort =
              options.abort->OnAbort([s = *store](const std::string& reason) { s->Abort(reason); });
          std::thread aborter([&, round] {
            absl::SleepFor(absl::Milliseconds(2 * round));  // where the abort lands
            options.abort->Abort("swept");
          });
          const absl::Time begin = absl::Now();
          auto comm = GlooCommunicator::Create(*store, rank, 3, options);
          aborter.join();
          const absl::StatusCode code = comm.status().code();
          if (code != absl::StatusCode::kOk) {
            std::cerr << "round " << round << ": " << comm.status() << "\n";
          }
          CHILD_CHECK(code == absl::StatusCode::kOk || code == absl::StatusCode::kAborted ||
                      code == absl::StatusCode::kUnavailable);
          CHILD_CHECK(absl::Now() - begin < absl::Seconds(20));
          // Rounds start together, so that a rank still in the last one does
          // not hold the others' pairs open.
          auto rounds = FileStore::Open(dir);
          CHILD_OK(rounds.status());
          CHILD_OK((*rounds)->Set(absl::StrCat("round", round, "-done-", rank), "1"));
          CHILD_OK((*rounds)->Wait(
              {absl::StrCat("round", round, "-done-0"), absl::StrCat("round", round, "-done-1"),
               absl::StrCat("round", round, "-done-2")},
              absl::Seconds(60)));
        }
        return 0;
      },
      absl::Seconds(120));
  EXPECT_TRUE(AllRanksSucceeded(results));
}

TEST(GlooCommunicatorTest, RejectsBadRank) {
  auto store = FileStore::Open(MakeTempDir("gloo-bad"));
  ASSERT_TRUE(store.ok());
  EXPECT_FALSE(GlooCommunicator::Create(*store, 2, 2, GlooOptions{}).ok());
}

}  // namespace
}  // namespace flatshard
