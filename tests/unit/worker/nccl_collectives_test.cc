// Tests worker/comm/nccl_collectives.h on a GPU (skips without one): one-rank
// NCCL collectives on a CUDA stream, and that an aborted communicator refuses
// every later call with the reason instead of touching the freed communicator.
#include "worker/comm/nccl_collectives.h"

#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "worker/comm/file_store.h"
#include "worker/device/cuda/cuda_device.h"
#include "worker/device/cuda/cuda_status.h"

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

TEST_F(NcclCollectivesTest, EveryCallAfterAnAbortIsRefusedWithTheReason) {
  DeviceBuffer a = *device_->Allocate(16, *stream_, MemoryKind::kActivations, nullptr);
  nccl_->Abort("a peer died");
  const absl::Status status =
      nccl_->AllReduce(*stream_, a.byte_span(), 4, DType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(status.message()), HasSubstr("a peer died"));
  EXPECT_EQ(nccl_->CreateSubgroup({0}, "x").status().code(), absl::StatusCode::kAborted);
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
