// Same-host collectives (process_vm_readv) between real processes, over a real
// Gloo group for the addresses and barriers: W in {2, 3, 4, 5}, counts not
// divisible by W, float32 / bfloat16, in place and not, every sum bit for bit
// the Gloo ring's, the fused gradient chunks bit for bit the separate steps,
// sub-groups (of one rank too), a rank that opts out, a rank whose seccomp
// filter forbids the reads (every rank falls back to Gloo and says why), a
// read that faults (both ranks fail at once, not at the timeout) and a peer
// killed with SIGKILL.
#include "worker/comm/same_host_communicator.h"

#include <cmath>
#include <csignal>
#include <cstddef>
#include <cstring>
#include <iostream>
#include <vector>

#include <gtest/gtest.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

#include "core/dtype.h"
#include "core/float16.h"
#include "tests/integration/multiprocess.h"
#include "worker/comm/file_store.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/gradient_chunks.h"

namespace flatshard {
namespace {

using testing::AllRanksSucceeded;
using testing::MakeTempDir;
using testing::RunRanks;

// Distinct, exactly representable in bf16, so any order of the sums agrees.
float Value(int rank, size_t i) { return static_cast<float>(rank * 3 + static_cast<int>(i % 17)); }

// Not exactly representable: the order of the sums shows in the bits.
float Noisy(int rank, size_t i) {
  return std::sin(static_cast<float>(i) * 0.37f + static_cast<float>(rank)) * 1e-3f;
}

// min_bytes 0: every collective takes the same-host path, however small.
std::unique_ptr<Communicator> Connect(const std::string& dir, int rank, int world,
                                      std::string* why_not = nullptr,
                                      absl::Duration timeout = absl::Seconds(30),
                                      SameHostOptions same_host = SameHostOptions{0},
                                      const std::string& prefix = "gloo") {
  auto store = FileStore::Open(dir);
  if (!store.ok()) return nullptr;
  GlooOptions options;
  options.timeout = timeout;
  options.prefix = prefix;
  auto gloo = GlooCommunicator::Create(*store, rank, world, options);
  if (!gloo.ok()) {
    std::cerr << "rank " << rank << ": " << gloo.status() << "\n";
    return nullptr;
  }
  auto comm = SameHostCommunicator::Wrap(*std::move(gloo), same_host, why_not);
  if (!comm.ok()) {
    std::cerr << "rank " << rank << ": " << comm.status() << "\n";
    return nullptr;
  }
  return *std::move(comm);
}

bool IsSameHost(const std::unique_ptr<Communicator>& c) {
  return dynamic_cast<SameHostCommunicator*>(c.get()) != nullptr;
}

int CollectivesBody(const std::string& dir, int rank, int world) {
  std::string why_not;
  auto comm = Connect(dir, rank, world, &why_not);
  CHILD_CHECK(comm != nullptr);
  CHILD_CHECK(IsSameHost(comm));
  CHILD_CHECK(why_not.empty());
  CHILD_CHECK(comm->rank() == rank && comm->size() == world);
  const auto w = static_cast<size_t>(world);
  for (size_t count : {size_t{1}, size_t{7}, size_t{1001}, size_t{65537}, size_t{200003}}) {
    std::vector<float> shard(count), gathered(count * w, -1.0f);
    for (size_t i = 0; i < count; ++i) shard[i] = Value(rank, i);
    CHILD_OK(comm->AllGather(shard.data(), gathered.data(), count, DType::kFloat32));
    for (int r = 0; r < world; ++r) {
      for (size_t i = 0; i < count; ++i) {
        CHILD_CHECK(gathered[static_cast<size_t>(r) * count + i] == Value(r, i));
      }
    }
    std::vector<float> inplace(count * w, -1.0f);
    std::copy(shard.begin(), shard.end(),
              inplace.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(rank) * count));
    CHILD_OK(comm->AllGather(inplace.data() + static_cast<size_t>(rank) * count, inplace.data(),
                             count, DType::kFloat32));
    CHILD_CHECK(inplace == gathered);

    std::vector<float> full(count * w);
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
    CHILD_CHECK(full[0] == Value(rank, 0) + 0.5f);  // the input is left alone
    // In place: this rank's chunk of the buffer holds the same sums.
    CHILD_OK(comm->ReduceScatterInPlace(full.data(), count, DType::kFloat32));
    CHILD_CHECK(
        std::equal(out.begin(), out.end(),
                   full.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(rank) * count)));

    // All-reduce, sum and max, in bf16 too (rounded after every addition).
    std::vector<float> sum(count), max(count);
    std::vector<uint16_t> bf(count);
    for (size_t i = 0; i < count; ++i) {
      sum[i] = max[i] = Value(rank, i);
      bf[i] = FloatToBFloat16(Value(rank, i));
    }
    CHILD_OK(comm->AllReduce(sum.data(), count, DType::kFloat32, ReduceOp::kSum));
    CHILD_OK(comm->AllReduce(max.data(), count, DType::kFloat32, ReduceOp::kMax));
    CHILD_OK(comm->AllReduce(bf.data(), count, DType::kBFloat16, ReduceOp::kSum));
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int r = 0; r < world; ++r) want += Value(r, i);
      CHILD_CHECK(sum[i] == want);
      CHILD_CHECK(BFloat16ToFloat(bf[i]) == want);
      CHILD_CHECK(max[i] == Value(world - 1, i));
    }

    std::vector<float> cast(count, rank == world - 1 ? 2.5f : -1.0f);
    CHILD_OK(comm->Broadcast(cast.data(), count, DType::kFloat32, world - 1));
    for (float v : cast) CHILD_CHECK(v == 2.5f);
  }
  return 0;
}

// The fused gradient (chunks produced and consumed where the reads touch
// them; at W=2 straight from the caller's gradient) against the separate
// steps on the same communicator, bit for bit, in place on the padded fp32
// gradient and into a bf16 work buffer.
int GradientBody(const std::string& dir, int rank, int world) {
  auto comm = Connect(dir, rank, world);
  CHILD_CHECK(comm != nullptr && IsSameHost(comm));
  const auto w = static_cast<size_t>(world);
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    // The last: a first gradient (written, not accumulated) with a shard past
    // the 4 MiB from which it is streamed out (gradient_chunks.cc).
    const size_t big = w * ((size_t{4} << 20) / sizeof(float) + 3) - 2;
    for (size_t n : {size_t{100000}, size_t{100003}, big}) {
      const size_t count = (n + w - 1) / w;
      const bool accumulate = n != big;
      std::vector<float> grad(count * w, 0.0f);  // padded, zeros past n
      for (size_t i = 0; i < n; ++i) grad[i] = Noisy(rank, i);
      const std::vector<float> original = grad;
      GradientChunksSpec spec{
          nullptr, n, count, dtype, 2.0, static_cast<double>(world) / 2.0, nullptr, accumulate};
      // Fused.
      std::vector<float> fused(count, 0.25f);
      std::vector<std::byte> work(count * w * DTypeSize(dtype));
      spec.grad = grad.data();
      spec.grad_shard = fused.data();
      void* fused_work = dtype == DType::kFloat32 ? static_cast<void*>(grad.data()) : work.data();
      CHILD_OK(comm->ReduceScatterChunked(*MakeGradientChunks(spec), fused_work, count, dtype));
      // Separate: produce every chunk, reduce in place, consume (the base
      // class's steps, run on the inner path's own primitives).
      std::vector<float> separate(count, 0.25f);
      spec.grad = original.data();
      spec.grad_shard = separate.data();
      auto chunks = MakeGradientChunks(spec);
      for (size_t c = 0; c < w; ++c) {
        chunks->Produce(c, 0, count, work.data() + c * count * DTypeSize(dtype));
      }
      CHILD_OK(comm->ReduceScatterInPlace(work.data(), count, dtype));
      chunks->Consume(0, count, work.data() + static_cast<size_t>(rank) * count * DTypeSize(dtype));
      CHILD_CHECK(std::memcmp(fused.data(), separate.data(), count * sizeof(float)) == 0);
      // And near the exact sum (bf16 loses most digits).
      const size_t first = static_cast<size_t>(rank) * count;
      for (size_t i = 0; i < count && first + i < n; ++i) {
        double want = 0;
        for (int r = 0; r < world; ++r) want += Noisy(r, first + i);
        want = want / world + (accumulate ? 0.25 : 0.0);
        const double tolerance = dtype == DType::kFloat32 ? 1e-6 : 1e-2 * std::abs(want) + 1e-5;
        CHILD_CHECK(std::abs(fused[i] - want) <= tolerance);
      }
    }
  }
  return 0;
}

// Every sum bit for bit the Gloo ring's (the path the inner communicator
// takes for small collectives, and every collective where the probe fails):
// values whose sums round, W ranks, fp32 and bf16, counts not divisible by W.
int RingBitsBody(const std::string& dir, int rank, int world) {
  auto same_host = Connect(dir, rank, world);
  CHILD_CHECK(same_host != nullptr && IsSameHost(same_host));
  // min_bytes beyond every buffer here: the wrapper hands all to Gloo's ring.
  auto ring = Connect(dir, rank, world, nullptr, absl::Seconds(30),
                      SameHostOptions{size_t{1} << 40}, "ring");
  CHILD_CHECK(ring != nullptr);
  const auto w = static_cast<size_t>(world);
  auto same_bits = [](const auto& a, const auto& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
  };
  const size_t count = 30011;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    const size_t es = DTypeSize(dtype);
    std::vector<float> values(count * w);
    for (size_t i = 0; i < values.size(); ++i) values[i] = Noisy(rank, i);
    std::vector<std::byte> input(values.size() * es);
    ConvertElements(DType::kFloat32, reinterpret_cast<const std::byte*>(values.data()), dtype,
                    input.data(), values.size());
    std::vector<std::byte> a = input, b = input;
    CHILD_OK(same_host->ReduceScatterInPlace(a.data(), count, dtype));
    CHILD_OK(ring->ReduceScatterInPlace(b.data(), count, dtype));
    const size_t mine = static_cast<size_t>(rank) * count * es;
    CHILD_CHECK(std::memcmp(a.data() + mine, b.data() + mine, count * es) == 0);
    std::vector<std::byte> out_a(count * es), out_b(count * es);
    CHILD_OK(same_host->ReduceScatter(input.data(), out_a.data(), count, dtype));
    CHILD_OK(ring->ReduceScatter(input.data(), out_b.data(), count, dtype));
    CHILD_CHECK(same_bits(out_a, out_b));
    a = input;
    b = input;
    CHILD_OK(same_host->AllReduce(a.data(), count * w - 3, dtype, ReduceOp::kSum));
    CHILD_OK(ring->AllReduce(b.data(), count * w - 3, dtype, ReduceOp::kSum));
    CHILD_CHECK(same_bits(a, b));
    // The fused gradient: pre- and post-divided, accumulated.
    const size_t n = count * w - 5;
    std::vector<float> grad(count * w, 0.0f);
    for (size_t i = 0; i < n; ++i) grad[i] = values[i];
    std::vector<float> shard_a(count, 0.125f), shard_b(count, 0.125f);
    std::vector<std::byte> work(count * w * es);
    GradientChunksSpec spec{
        grad.data(), n, count, dtype, 2.0, static_cast<double>(world) / 2.0, shard_a.data(), true};
    CHILD_OK(same_host->ReduceScatterChunked(*MakeGradientChunks(spec), work.data(), count, dtype));
    spec.grad_shard = shard_b.data();
    CHILD_OK(ring->ReduceScatterChunked(*MakeGradientChunks(spec), work.data(), count, dtype));
    CHILD_CHECK(same_bits(shard_a, shard_b));
    if (dtype == DType::kFloat32) {
      // Mixed: even ranks reduce on their own padded gradient (from W=3 their
      // raw chunks stay in place and their readers finish them), odd ranks
      // into a separate buffer (every chunk produced). The same bits still.
      std::vector<float> own = grad;
      std::vector<float> shard_c(count, 0.125f);
      spec.grad = own.data();
      spec.grad_shard = shard_c.data();
      void* mixed_work = rank % 2 == 0 ? static_cast<void*>(own.data()) : work.data();
      CHILD_OK(
          same_host->ReduceScatterChunked(*MakeGradientChunks(spec), mixed_work, count, dtype));
      CHILD_CHECK(same_bits(shard_c, shard_b));
    }
  }
  return 0;
}

class SameHostCollectivesTest : public ::testing::TestWithParam<int> {};

TEST_P(SameHostCollectivesTest, EverySumIsBitForBitTheGlooRings) {
  const int world = GetParam();
  const std::string dir = MakeTempDir(absl::StrCat("same-host-bits-", world));
  auto results = RunRanks(
      world, [&](int rank) { return RingBitsBody(dir, rank, world); }, absl::Seconds(120));
  EXPECT_TRUE(AllRanksSucceeded(results));
}

TEST_P(SameHostCollectivesTest, AllCollectivesAgreeWithLocalArithmetic) {
  const int world = GetParam();
  const std::string dir = MakeTempDir(absl::StrCat("same-host-", world));
  auto results = RunRanks(
      world, [&](int rank) { return CollectivesBody(dir, rank, world); }, absl::Seconds(120));
  EXPECT_TRUE(AllRanksSucceeded(results));
}

TEST_P(SameHostCollectivesTest, FusedGradientEqualsTheSeparateStepsBitForBit) {
  const int world = GetParam();
  const std::string dir = MakeTempDir(absl::StrCat("same-host-grad-", world));
  auto results = RunRanks(
      world, [&](int rank) { return GradientBody(dir, rank, world); }, absl::Seconds(120));
  EXPECT_TRUE(AllRanksSucceeded(results));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, SameHostCollectivesTest, ::testing::Values(2, 3, 4, 5));

// A sub-group reads the same processes, by their ranks in the sub-group.
TEST(SameHostCommunicatorTest, SubgroupsReadTheirMembers) {
  const std::string dir = MakeTempDir("same-host-sub");
  auto results = RunRanks(
      4,
      [&](int rank) {
        auto comm = Connect(dir, rank, 4);
        CHILD_CHECK(comm != nullptr && IsSameHost(comm));
        const std::vector<int> members =
            rank % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3};
        auto sub = comm->CreateSubgroup(members, absl::StrCat("pair", rank % 2));
        CHILD_OK(sub.status());
        CHILD_CHECK(IsSameHost(*sub) && (*sub)->size() == 2 && (*sub)->rank() == rank / 2);
        std::vector<float> mine(5000, static_cast<float>(rank)), all(10000);
        CHILD_OK((*sub)->AllGather(mine.data(), all.data(), 5000, DType::kFloat32));
        CHILD_CHECK(all[0] == static_cast<float>(members[0]) &&
                    all[9999] == static_cast<float>(members[1]));
        return 0;
      },
      absl::Seconds(60));
  EXPECT_TRUE(AllRanksSucceeded(results));
}

// After a fallback, the group of three still gathers (over Gloo).
int ThreeRanksStillGather(Communicator& comm, int rank) {
  std::vector<float> mine(1000, static_cast<float>(rank)), all(3000);
  CHILD_OK(comm.AllGather(mine.data(), all.data(), 1000, DType::kFloat32));
  CHILD_CHECK(all[0] == 0.0f && all[1000] == 1.0f && all[2999] == 2.0f);
  return 0;
}

// A sub-group of one rank (HYBRID_SHARD with shard groups of one): every
// collective is this rank's own data, as on Gloo.
TEST(SameHostCommunicatorTest, OneRankSubgroupsKeepTheirOwnData) {
  const std::string dir = MakeTempDir("same-host-solo");
  auto results = RunRanks(
      2,
      [&](int rank) {
        auto comm = Connect(dir, rank, 2);
        CHILD_CHECK(comm != nullptr && IsSameHost(comm));
        auto solo = comm->CreateSubgroup({rank}, absl::StrCat("solo", rank));
        CHILD_OK(solo.status());
        CHILD_CHECK((*solo)->size() == 1 && (*solo)->rank() == 0);
        std::vector<float> in(70000, 1.5f + static_cast<float>(rank)), out(70000, -1.0f);
        CHILD_OK((*solo)->ReduceScatter(in.data(), out.data(), 70000, DType::kFloat32));
        CHILD_CHECK(out == in);
        std::vector<float> gathered(70000, -1.0f);
        CHILD_OK((*solo)->AllGather(in.data(), gathered.data(), 70000, DType::kFloat32));
        CHILD_CHECK(gathered == in);
        std::vector<float> grad(70000, 3.0f), shard(70000, 1.0f), work(70000);
        GradientChunksSpec spec{grad.data(), 70000, 70000,        DType::kFloat32,
                                1.0,         1.0,   shard.data(), true};
        CHILD_OK((*solo)->ReduceScatterChunked(*MakeGradientChunks(spec), work.data(), 70000,
                                               DType::kFloat32));
        for (float v : shard) CHILD_CHECK(v == 4.0f);
        return 0;
      },
      absl::Seconds(60));
  EXPECT_TRUE(AllRanksSucceeded(results));
}

// A rank whose options turn the same-host path off takes every rank with it,
// instead of leaving the group split between two protocols.
TEST(SameHostCommunicatorTest, ARankThatOptsOutLeavesEveryRankOnGloo) {
  const std::string dir = MakeTempDir("same-host-opt-out");
  auto results = RunRanks(
      3,
      [&](int rank) {
        SameHostOptions options{0};
        options.enabled = rank != 2;
        std::string why_not;
        auto comm = Connect(dir, rank, 3, &why_not, absl::Seconds(30), options);
        CHILD_CHECK(comm != nullptr && !IsSameHost(comm));
        CHILD_CHECK(why_not.find("rank 2 opted out") != std::string::npos);
        return ThreeRanksStillGather(*comm, rank);
      },
      absl::Seconds(60));
  EXPECT_TRUE(AllRanksSucceeded(results));
}

// Ranks that ask for different thresholds take the largest: a collective
// one rank would send to Gloo's ring no rank sends down the same-host path
// (where the two would wait on different messages until the timeout).
TEST(SameHostCommunicatorTest, RanksWithDifferentThresholdsAgreeOnThePath) {
  const std::string dir = MakeTempDir("same-host-thresholds");
  auto results = RunRanks(
      2,
      [&](int rank) {
        const SameHostOptions options{rank == 0 ? size_t{0} : size_t{1} << 20};
        auto comm = Connect(dir, rank, 2, nullptr, absl::Seconds(10), options);
        CHILD_CHECK(comm != nullptr && IsSameHost(comm));
        // 8 KB gathered: under rank 1's threshold; 4 MiB: over both.
        for (size_t count : {size_t{1000}, size_t{1} << 19}) {
          std::vector<float> shard(count), gathered(2 * count, -1.0f);
          for (size_t i = 0; i < count; ++i) shard[i] = Value(rank, i);
          CHILD_OK(comm->AllGather(shard.data(), gathered.data(), count, DType::kFloat32));
          for (int r = 0; r < 2; ++r) {
            for (size_t i = 0; i < count; ++i) {
              CHILD_CHECK(gathered[static_cast<size_t>(r) * count + i] == Value(r, i));
            }
          }
        }
        return 0;
      },
      absl::Seconds(60));
  EXPECT_TRUE(AllRanksSucceeded(results));
}

// Makes process_vm_readv fail with EPERM in this process, as a container
// runtime's seccomp profile can.
bool ForbidCrossMemoryReads() {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_process_vm_readv, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog program{static_cast<uint16_t>(std::size(filter)), filter};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) == 0;
}

// One rank that may not read: every rank keeps Gloo, learns which rank and
// why, and the collectives still work.
TEST(SameHostCommunicatorTest, ARankThatMayNotReadLeavesEveryRankOnGloo) {
  const std::string dir = MakeTempDir("same-host-seccomp");
  auto results = RunRanks(
      3,
      [&](int rank) {
        if (rank == 1) CHILD_CHECK(ForbidCrossMemoryReads());
        std::string why_not;
        auto comm = Connect(dir, rank, 3, &why_not);
        CHILD_CHECK(comm != nullptr);
        CHILD_CHECK(!IsSameHost(comm));
        std::cerr << "rank " << rank << ": " << why_not << "\n";
        CHILD_CHECK(why_not.find("rank 1 cannot read rank 0's memory") != std::string::npos);
        CHILD_CHECK(why_not.find(std::strerror(EPERM)) != std::string::npos);
        return ThreeRanksStillGather(*comm, rank);
      },
      absl::Seconds(60));
  EXPECT_TRUE(AllRanksSucceeded(results));
}

// The root publishes memory that cannot be read: the reader fails at once,
// naming the root, and aborts the group, so the root's barrier fails well
// before the collective timeout instead of waiting it out.
TEST(SameHostCommunicatorTest, AFaultingReadFailsBothRanksPromptly) {
  const std::string dir = MakeTempDir("same-host-fault");
  auto results = RunRanks(
      2,
      [&](int rank) {
        auto comm = Connect(dir, rank, 2, nullptr, absl::Seconds(60));
        CHILD_CHECK(comm != nullptr && IsSameHost(comm));
        const size_t bytes = size_t{1} << 20;
        void* guard = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHILD_CHECK(guard != MAP_FAILED);
        std::vector<float> buffer(bytes / sizeof(float));
        void* mine = rank == 0 ? guard : buffer.data();
        const absl::Time begin = absl::Now();
        const absl::Status status =
            comm->Broadcast(mine, bytes / sizeof(float), DType::kFloat32, 0);
        const absl::Duration took = absl::Now() - begin;
        std::cerr << "rank " << rank << ": " << status << " after " << took << "\n";
        CHILD_CHECK(!status.ok());
        CHILD_CHECK(took < absl::Seconds(20));
        if (rank == 1) {
          CHILD_CHECK(status.code() == absl::StatusCode::kInternal);
          CHILD_CHECK(std::string(status.message()).find("process_vm_readv from rank 0") !=
                      std::string::npos);
        }
        // The group is unusable afterwards, on both ranks.
        CHILD_CHECK(!comm->AllGather(buffer.data(), buffer.data(), 1, DType::kFloat32).ok());
        munmap(guard, bytes);
        return 0;
      },
      absl::Seconds(60));
  EXPECT_TRUE(AllRanksSucceeded(results));
}

// A peer killed with SIGKILL: the survivor's next collective fails promptly.
TEST(SameHostCommunicatorTest, APeerKilledMidJobFailsTheSurvivorPromptly) {
  const std::string dir = MakeTempDir("same-host-kill");
  auto results = RunRanks(
      2,
      [&](int rank) {
        auto comm = Connect(dir, rank, 2, nullptr, absl::Seconds(60));
        CHILD_CHECK(comm != nullptr && IsSameHost(comm));
        std::vector<float> mine(100000, 1.0f), all(200000);
        CHILD_OK(comm->AllGather(mine.data(), all.data(), 100000, DType::kFloat32));
        if (rank == 1) raise(SIGKILL);
        const absl::Time begin = absl::Now();
        const absl::Status status =
            comm->AllGather(mine.data(), all.data(), 100000, DType::kFloat32);
        std::cerr << "rank 0: " << status << "\n";
        CHILD_CHECK(!status.ok());
        CHILD_CHECK(absl::Now() - begin < absl::Seconds(20));
        return 0;
      },
      absl::Seconds(60));
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].exit_code, 0);
  EXPECT_EQ(results[1].signal, SIGKILL);
}

}  // namespace
}  // namespace flatshard
