// Tests worker/comm/nccl_collectives.h on a GPU (skips without one): one-rank
// NCCL collectives on a CUDA stream, that an aborted communicator refuses
// every later call with the reason instead of touching the freed communicator,
// and that an initialization waiting for a rank that never joins ends on an
// abort or at the timeout (non-blocking NCCL, worker/comm/nccl_wait.h).
#include "worker/comm/nccl_collectives.h"

#include <bit>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "worker/comm/abort_signal.h"
#include "worker/comm/file_store.h"
#include "worker/device/cuda/cuda_device.h"
#include "worker/device/cuda/cuda_status.h"
#include "worker/device/host/host_kernels.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;

class NcclCollectivesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";
    device_ = *cuda::CudaDevice::Create(0);
    ASSERT_TRUE(device_->MakeCurrent().ok());
    stream_ = *device_->CreateStream(StreamRole::kCommunication, "comm");
    auto store = FileStore::Open(::testing::TempDir() + "/nccl-one-" + std::to_string(getpid()));
    ASSERT_TRUE(store.ok()) << store.status();
    NcclOptions options;
    options.timeout = absl::Seconds(30);
    auto nccl = NcclCollectives::Create(*store, 0, 1, options);
    ASSERT_TRUE(nccl.ok()) << nccl.status();
    nccl_ = *std::move(nccl);
  }

  std::unique_ptr<cuda::CudaDevice> device_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<NcclCollectives> nccl_;
};

TEST_F(NcclCollectivesTest, OneRankCollectivesRunOnTheStream) {
  std::vector<float> host = {1, 2, 3, 4};
  DeviceBuffer a = *device_->Allocate(16, *stream_, MemoryKind::kActivations, nullptr);
  DeviceBuffer b = *device_->Allocate(16, *stream_, MemoryKind::kActivations, nullptr);
  ASSERT_TRUE(stream_->CopyToDevice(a.byte_span(), std::as_bytes(std::span(host))).ok());
  ASSERT_TRUE(nccl_->AllReduce(*stream_, a.byte_span(), 4, DType::kFloat32, ReduceOp::kSum).ok());
  ASSERT_TRUE(nccl_->AllGather(*stream_, a.byte_span(), b.byte_span(), 4, DType::kFloat32).ok());
  ASSERT_TRUE(nccl_->Broadcast(*stream_, b.byte_span(), 4, DType::kFloat32, 0).ok());
  // In place (recvbuff = sendbuff + rank * count): one rank's sum is its own.
  ASSERT_TRUE(nccl_->ReduceScatterInPlace(*stream_, b.byte_span(), 4, DType::kFloat32).ok());
  EXPECT_EQ(nccl_->ReduceScatterInPlace(*stream_, b.byte_span(), 5, DType::kFloat32).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<float> back(4);
  ASSERT_TRUE(stream_->CopyToHost(std::as_writable_bytes(std::span(back)), b.byte_span()).ok());
  ASSERT_TRUE(stream_->Synchronize().ok());
  EXPECT_EQ(back, host);
  EXPECT_EQ(nccl_->Broadcast(*stream_, b.byte_span(), 4, DType::kFloat32, 3).code(),
            absl::StatusCode::kInvalidArgument);
}

// ReduceGradient's fused NCCL form (the pre-divide folded into the
// reduce-scatter, a first gradient written straight into the shard) and the
// three-step form it falls back to must both give, bit for bit, what the
// separate element passes give on the host: at one rank the sum is the rank's
// own value.
struct GradientCase {
  const char* name;
  DType reduce_dtype;
  double pre;
  double post;
  bool accumulate;
  size_t grad_count;  // < count: padded with zeros
  // The work buffer is the gradient's own, padded with zeros (FlatParamUnit's
  // float32 form): NCCL's in-place reduce-scatter.
  bool in_place = false;
};

TEST_F(NcclCollectivesTest, ReduceGradientMatchesTheSeparatePassesBitForBit) {
  constexpr size_t kCount = 1000;
  const GradientCase cases[] = {
      {"fused, first gradient into the shard", DType::kFloat32, 1, 1, false, kCount},
      {"fused, pre and post folded", DType::kFloat32, 2, 4, false, kCount},
      {"fused pre, post 3 applied after", DType::kFloat32, 2, 3, false, kCount},
      {"fused pre, accumulated", DType::kFloat32, 4, 2, true, kCount},
      {"padded: three steps", DType::kFloat32, 2, 1, true, kCount - 7},
      {"bf16: three steps", DType::kBFloat16, 2, 3, true, kCount},
      {"pre 3: three steps", DType::kFloat32, 3, 1, false, kCount},
      {"in place, first into the shard", DType::kFloat32, 2, 4, false, kCount, true},
      {"in place, accumulated", DType::kFloat32, 4, 2, true, kCount, true},
      {"in place, padded: three steps", DType::kFloat32, 2, 3, true, kCount - 7, true},
  };
  for (const GradientCase& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<float> grad(c.grad_count);
    std::vector<float> shard(kCount);
    for (size_t i = 0; i < grad.size(); ++i) grad[i] = static_cast<float>(i) * 0.37f - 91.3f;
    for (size_t i = 0; i < kCount; ++i) shard[i] = 1.0f / static_cast<float>(i + 3);
    // The host's separate passes: prepare (cast, pre-divide, pad), the
    // one-rank sum (itself), accumulate (post-divide, add) into the shard or
    // into zeros.
    std::vector<std::byte> prepared(kCount * DTypeSize(c.reduce_dtype));
    host_kernels::PrepareGradForReduce(grad.data(), grad.size(), c.reduce_dtype, prepared.data(),
                                       kCount, c.pre);
    std::vector<float> want = c.accumulate ? shard : std::vector<float>(kCount, 0.0f);
    host_kernels::AccumulateReducedGrad(c.reduce_dtype, prepared.data(), want.data(), kCount,
                                        c.post);

    std::vector<float> held = grad;
    if (c.in_place) held.resize(kCount, 0.0f);
    DeviceBuffer g = *device_->Allocate(held.size() * 4, *stream_, MemoryKind::kGradients, nullptr);
    DeviceBuffer work =
        *device_->Allocate(prepared.size(), *stream_, MemoryKind::kGradients, nullptr);
    DeviceBuffer out = *device_->Allocate(kCount * 4, *stream_, MemoryKind::kGradients, nullptr);
    ASSERT_TRUE(stream_->CopyToDevice(g.byte_span(), std::as_bytes(std::span(held))).ok());
    // A first gradient's shard holds garbage: it must be written, not read.
    std::vector<float> initial = c.accumulate ? shard : std::vector<float>(kCount, 7.5e30f);
    ASSERT_TRUE(stream_->CopyToDevice(out.byte_span(), std::as_bytes(std::span(initial))).ok());
    ASSERT_TRUE(nccl_
                    ->ReduceGradient(
                        *stream_, GradientReduction{g.span<const float>().first(c.grad_count),
                                                    c.reduce_dtype, c.pre, c.post,
                                                    c.in_place ? g.byte_span() : work.byte_span(),
                                                    kCount, out.span<float>(), c.accumulate})
                    .ok());
    std::vector<float> got(kCount);
    ASSERT_TRUE(stream_->CopyToHost(std::as_writable_bytes(std::span(got)), out.byte_span()).ok());
    ASSERT_TRUE(stream_->Synchronize().ok());
    for (size_t i = 0; i < kCount; ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
          << "element " << i << ": " << got[i] << " vs " << want[i];
    }
  }
  // Bad arguments name the field, whichever form would have run.
  DeviceBuffer small = *device_->Allocate(16, *stream_, MemoryKind::kGradients, nullptr);
  const absl::Status refused = nccl_->ReduceGradient(
      *stream_, GradientReduction{small.span<const float>(), DType::kFloat32, 1, 1,
                                  small.byte_span(), 4, small.span<float>().first(3), false});
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("grad_shard"));
}

// A split on the non-blocking communicator: NCCL returns from ncclCommSplit
// before the split has run, and hands the new communicator over only when it
// has; the subgroup must come back whole and run a collective.
TEST_F(NcclCollectivesTest, ASplitReturnsTheSubgroupOnceNcclHasMadeIt) {
  auto solo = nccl_->CreateSubgroup({0}, "solo");
  ASSERT_TRUE(solo.ok()) << solo.status();
  EXPECT_EQ((*solo)->size(), 1);
  std::vector<float> host = {1, 2, 3, 4};
  DeviceBuffer a = *device_->Allocate(16, *stream_, MemoryKind::kActivations, nullptr);
  ASSERT_TRUE(stream_->CopyToDevice(a.byte_span(), std::as_bytes(std::span(host))).ok());
  ASSERT_TRUE((*solo)->AllReduce(*stream_, a.byte_span(), 4, DType::kFloat32, ReduceOp::kSum).ok());
  std::vector<float> back(4);
  ASSERT_TRUE(stream_->CopyToHost(std::as_writable_bytes(std::span(back)), a.byte_span()).ok());
  ASSERT_TRUE(stream_->Synchronize().ok());
  EXPECT_EQ(back, host);
}

TEST_F(NcclCollectivesTest, EveryCallAfterAnAbortIsRefusedWithTheReason) {
  DeviceBuffer a = *device_->Allocate(16, *stream_, MemoryKind::kActivations, nullptr);
  nccl_->Abort("a peer died");
  const absl::Status status =
      nccl_->AllReduce(*stream_, a.byte_span(), 4, DType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(status.message()), HasSubstr("a peer died"));
  EXPECT_EQ(nccl_->CreateSubgroup({0}, "x").status().code(), absl::StatusCode::kAborted);
}

// A rank whose peers never join (they died before their Configure reached
// NCCL) must not hold its worker inside ncclCommInitRank forever: rank 0 of
// two waits alone here. The store holding the unique id says rank 0 has
// reached NCCL's initialization; aborting the Configure's signal then ends it.
TEST(NcclInitializationTest, WaitingForARankThatNeverJoinsEndsWhenAborted) {
  if (cuda::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  auto store = FileStore::Open(::testing::TempDir() + "/nccl-abort-" + std::to_string(getpid()));
  ASSERT_TRUE(store.ok()) << store.status();
  NcclOptions options;
  options.timeout = absl::Seconds(300);  // far past the test's: only the abort ends it
  options.abort = std::make_shared<AbortSignal>();
  absl::StatusOr<std::unique_ptr<NcclCollectives>> created;
  std::thread rank0([&] { created = NcclCollectives::Create(*store, 0, 2, options); });
  const absl::Status published = (*store)->Get("nccl/unique_id", absl::Seconds(60)).status();
  options.abort->Abort("the test aborts the configure");
  rank0.join();
  ASSERT_TRUE(published.ok()) << published;
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.status().code(), absl::StatusCode::kAborted) << created.status();
  EXPECT_THAT(std::string(created.status().message()), HasSubstr("the test aborts the configure"));
  EXPECT_THAT(std::string(created.status().message()), HasSubstr("nccl rank 0 of 2"));
}

TEST(NcclInitializationTest, WaitingForARankThatNeverJoinsEndsAtTheTimeout) {
  if (cuda::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  auto store = FileStore::Open(::testing::TempDir() + "/nccl-late-" + std::to_string(getpid()));
  ASSERT_TRUE(store.ok()) << store.status();
  NcclOptions options;
  options.timeout = absl::Seconds(2);
  auto created = NcclCollectives::Create(*store, 0, 2, options);
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.status().code(), absl::StatusCode::kDeadlineExceeded) << created.status();
  EXPECT_THAT(std::string(created.status().message()), HasSubstr("other 1 ranks to join"));
}

TEST(NcclWithoutGpuTest, CreateSaysTheDeviceIsMissing) {
  if (cuda::CudaDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is present";
  auto store = FileStore::Open(::testing::TempDir() + "/nccl-none");
  ASSERT_TRUE(store.ok());
  auto nccl = NcclCollectives::Create(*store, 0, 1, NcclOptions{});
  EXPECT_EQ(nccl.status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace flatshard
