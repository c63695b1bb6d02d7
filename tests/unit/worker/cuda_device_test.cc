// The CUDA/NCCL path: without a device every entry point says so with
// FAILED_PRECONDITION (checked here on CPU machines); with one, buffers,
// cuBLAS Linear and a one-rank NCCL communicator are checked against the host
// arithmetic. GPU-only tests skip, never pass vacuously.
#include <cmath>
#include <random>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "worker/comm/file_store.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/device/cuda/cuda_buffer.h"
#include "worker/device/cuda/cuda_status.h"
#include "worker/device/cuda/linear_kernels.h"

namespace flatshard::cuda {
namespace {

bool HaveDevice() { return CudaDeviceCount() > 0; }

TEST(CudaWithoutDeviceTest, EntryPointsSayThereIsNoDevice) {
  if (HaveDevice()) GTEST_SKIP() << "a CUDA device is present";
  MemoryTracker memory;
  auto buffer = CudaBuffer::Allocate(CudaBuffer::Where::kDevice, 16, DType::kFloat32, &memory,
                                     MemoryKind::kShardedParams);
  EXPECT_EQ(buffer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(memory.current(MemoryKind::kShardedParams), 0);
  auto store = FileStore::Open(::testing::TempDir() + "/nccl-no-device");
  ASSERT_TRUE(store.ok());
  auto comm = NcclCommunicator::Create(*store, 0, 1, NcclOptions{});
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(CudaDeviceTest, BuffersAreAccounted) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device on this machine";
  MemoryTracker memory;
  {
    auto device = CudaBuffer::Allocate(CudaBuffer::Where::kDevice, 1024, DType::kBFloat16, &memory,
                                       MemoryKind::kUnshardedParams);
    ASSERT_TRUE(device.ok()) << device.status();
    auto pinned = CudaBuffer::Allocate(CudaBuffer::Where::kPinnedHost, 256, DType::kFloat32,
                                       &memory, MemoryKind::kShardedParams);
    ASSERT_TRUE(pinned.ok()) << pinned.status();
    EXPECT_EQ(memory.current(MemoryKind::kUnshardedParams), 2048);
    EXPECT_EQ(static_cast<float*>(pinned->data())[17], 0.0f);
  }
  EXPECT_EQ(memory.current(MemoryKind::kUnshardedParams), 0);
  EXPECT_EQ(memory.current(MemoryKind::kShardedParams), 0);
}

TEST(CudaDeviceTest, LinearMatchesHostArithmetic) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device on this machine";
  const size_t n = 5, in = 7, out = 3;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> x(n * in), w(out * in), b(out), dy(n * out);
  for (auto* v : {&x, &w, &b, &dy}) {
    for (float& e : *v) e = normal(rng);
  }
  auto upload = [](const std::vector<float>& host) {
    void* d = nullptr;
    cudaMalloc(&d, host.size() * 4);
    cudaMemcpy(d, host.data(), host.size() * 4, cudaMemcpyHostToDevice);
    return static_cast<float*>(d);
  };
  float *dx_, *dy_ = upload(dy), *x_ = upload(x), *w_ = upload(w), *b_ = upload(b), *y_;
  float *dw_ = upload(std::vector<float>(out * in, 1.0f)),
        *db_ = upload(std::vector<float>(out, 1.0f));
  cudaMalloc(reinterpret_cast<void**>(&y_), n * out * 4);
  cudaMalloc(reinterpret_cast<void**>(&dx_), n * in * 4);
  cublasHandle_t handle;
  ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
  ASSERT_TRUE(LinearForward(handle, nullptr, x_, w_, b_, y_, 5, 7, 3).ok());
  ASSERT_TRUE(LinearBackward(handle, nullptr, x_, w_, dy_, dx_, dw_, db_, 5, 7, 3).ok());
  std::vector<float> y(n * out), dx(n * in), dw(out * in), db(out);
  cudaMemcpy(y.data(), y_, y.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(dx.data(), dx_, dx.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(dw.data(), dw_, dw.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(db.data(), db_, db.size() * 4, cudaMemcpyDeviceToHost);
  for (size_t r = 0; r < n; ++r) {
    for (size_t o = 0; o < out; ++o) {
      double want = b[o];
      for (size_t i = 0; i < in; ++i) want += double{x[r * in + i]} * w[o * in + i];
      EXPECT_NEAR(y[r * out + o], want, 1e-4);
    }
    for (size_t i = 0; i < in; ++i) {
      double want = 0;
      for (size_t o = 0; o < out; ++o) want += double{dy[r * out + o]} * w[o * in + i];
      EXPECT_NEAR(dx[r * in + i], want, 1e-4);
    }
  }
  for (size_t o = 0; o < out; ++o) {
    double want_b = 1.0;  // accumulated onto the initial 1
    for (size_t r = 0; r < n; ++r) want_b += dy[r * out + o];
    EXPECT_NEAR(db[o], want_b, 1e-4);
    for (size_t i = 0; i < in; ++i) {
      double want = 1.0;
      for (size_t r = 0; r < n; ++r) want += double{dy[r * out + o]} * x[r * in + i];
      EXPECT_NEAR(dw[o * in + i], want, 1e-4);
    }
  }
  cublasDestroy(handle);
  for (float* p : {x_, w_, b_, y_, dx_, dy_, dw_, db_}) cudaFree(p);
}

TEST(CudaDeviceTest, SingleRankNcclCollectives) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device on this machine";
  auto store = FileStore::Open(::testing::TempDir() + "/nccl-one");
  ASSERT_TRUE(store.ok());
  auto comm = NcclCommunicator::Create(*store, 0, 1, NcclOptions{});
  ASSERT_TRUE(comm.ok()) << comm.status();
  std::vector<float> host = {1, 2, 3, 4};
  float* d = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&d), 16);
  cudaMemcpy(d, host.data(), 16, cudaMemcpyHostToDevice);
  ASSERT_TRUE((*comm)->AllReduce(d, 4, DType::kFloat32, ReduceOp::kSum).ok());
  ASSERT_TRUE((*comm)->Barrier().ok());
  std::vector<float> back(4);
  cudaMemcpy(back.data(), d, 16, cudaMemcpyDeviceToHost);
  EXPECT_EQ(back, host);
  cudaFree(d);
}

}  // namespace
}  // namespace flatshard::cuda
