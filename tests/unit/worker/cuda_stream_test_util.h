// The fixture of the CUDA stream tests: every operation runs on the CPU device's
// inline compute stream (the reference, worker/device/host/) and on a CUDA
// stream with the same inputs, and the outputs are compared: bit for bit where
// the operation is elementwise or sums in the host's order, within a relative
// tolerance where the GPU reduces in another order. Outputs start poisoned (all
// bytes 0xFF, a NaN in every floating dtype) so an element the device never
// wrote fails the comparison. Inputs are random, from a generator seeded by the
// test's name (fresh per test, repeatable).
#ifndef FLATSHARD_TESTS_UNIT_WORKER_CUDA_STREAM_TEST_UTIL_H_
#define FLATSHARD_TESTS_UNIT_WORKER_CUDA_STREAM_TEST_UTIL_H_

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

#include "worker/device/cuda/cuda_device.h"
#include "worker/device/cuda/cuda_status.h"
#include "worker/device/device.h"
#include "worker/device/host/host_device.h"

namespace flatshard::cuda::testing {

enum class Side { kHost, kCuda };

// One tensor on both devices.
template <typename T>
struct Both {
  DeviceSpan<T> host;
  DeviceSpan<T> cuda;
  DeviceSpan<T> on(Side side) const { return side == Side::kHost ? host : cuda; }
  size_t size() const { return host.size(); }
};

class CudaStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";
    absl::StatusOr<std::unique_ptr<CudaDevice>> device = CudaDevice::Create(0);
    ASSERT_TRUE(device.ok()) << device.status();
    cuda_ = std::move(*device);
    ASSERT_TRUE(cuda_->MakeCurrent().ok());
    absl::StatusOr<std::unique_ptr<Stream>> host_stream =
        host_.CreateStream(StreamRole::kCompute, "host-compute");
    ASSERT_TRUE(host_stream.ok()) << host_stream.status();
    host_stream_ = std::move(*host_stream);
    absl::StatusOr<std::unique_ptr<Stream>> cuda_stream =
        cuda_->CreateStream(StreamRole::kCompute, "cuda-compute");
    ASSERT_TRUE(cuda_stream.ok()) << cuda_stream.status();
    cuda_stream_ = std::move(*cuda_stream);
    const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
    rng_.seed(static_cast<uint32_t>(
        std::hash<std::string>{}(absl::StrCat(test->test_suite_name(), ".", test->name()))));
  }

  void TearDown() override {
    if (cuda_stream_ != nullptr) {
      const absl::Status synced = cuda_stream_->Synchronize();
      EXPECT_TRUE(synced.ok()) << synced;
    }
  }

  Stream& stream(Side side) { return side == Side::kHost ? *host_stream_ : *cuda_stream_; }

  // Runs `op(stream, side)` on both devices; both must accept it.
  template <typename Op>
  void OnBoth(Op op) {
    for (Side side : {Side::kHost, Side::kCuda}) {
      const absl::Status status = op(stream(side), side);
      ASSERT_TRUE(status.ok()) << (side == Side::kHost ? "host: " : "cuda: ") << status;
    }
    const absl::Status synced = cuda_stream_->Synchronize();
    ASSERT_TRUE(synced.ok()) << synced;
  }

  // ---- tensors

  template <typename T>
  Both<T> Upload(const std::vector<T>& values) {
    Both<T> both = Allocate<T>(values.size());
    if (!values.empty()) {
      std::memcpy(HostDevice::HostAddress(both.host), values.data(), values.size() * sizeof(T));
      const absl::Status copied = cuda_stream_->CopyToDevice(
          AsWritableBytes(both.cuda), std::as_bytes(std::span<const T>(values)));
      EXPECT_TRUE(copied.ok()) << copied;
    }
    return both;
  }

  template <typename T>
  Both<T> Poisoned(size_t count) {
    std::vector<T> poison(count);
    std::memset(static_cast<void*>(poison.data()), 0xFF, count * sizeof(T));
    return Upload(poison);
  }

  template <typename T>
  std::vector<T> HostValues(const Both<T>& both) {
    const T* data = HostDevice::HostAddress(both.host);
    return std::vector<T>(data, data + both.size());
  }

  template <typename T>
  std::vector<T> CudaValues(const Both<T>& both) {
    std::vector<T> values(both.size());
    EXPECT_TRUE(cuda_stream_
                    ->CopyToHost(std::as_writable_bytes(std::span<T>(values)),
                                 AsBytes(DeviceSpan<const T>(both.cuda)))
                    .ok());
    const absl::Status synced = cuda_stream_->Synchronize();
    EXPECT_TRUE(synced.ok()) << synced;
    return values;
  }

  // ---- random inputs

  std::vector<float> Normal(size_t count, float stddev = 1.0f) {
    std::normal_distribution<float> normal(0.0f, stddev);
    std::vector<float> values(count);
    for (float& v : values) v = normal(rng_);
    return values;
  }

  std::vector<int32_t> Ints(size_t count, int32_t below) {
    std::uniform_int_distribution<int32_t> uniform(0, below - 1);
    std::vector<int32_t> values(count);
    for (int32_t& v : values) v = uniform(rng_);
    return values;
  }

  // ---- comparisons

  // Every element bit for bit.
  template <typename T>
  void ExpectBitEqual(const Both<T>& both, const std::string& what) {
    const std::vector<T> host = HostValues(both), cuda = CudaValues(both);
    int reported = 0;
    for (size_t i = 0; i < host.size(); ++i) {
      using Bytes = std::array<unsigned char, sizeof(T)>;
      if (std::bit_cast<Bytes>(host[i]) == std::bit_cast<Bytes>(cuda[i])) continue;
      ADD_FAILURE() << what << "[" << i << "]: host " << Printable(host[i]) << ", cuda "
                    << Printable(cuda[i]);
      if (++reported == 5) return;
    }
  }

  // |cuda - host| <= tolerance(i, host) for every element, NaN never close.
  template <typename T>
  void ExpectNear(const Both<T>& both, const std::string& what,
                  const std::function<double(size_t, double)>& tolerance) {
    const std::vector<T> host = HostValues(both), cuda = CudaValues(both);
    int reported = 0;
    for (size_t i = 0; i < host.size(); ++i) {
      const double h = host[i], c = cuda[i];
      if (std::fabs(c - h) <= tolerance(i, h)) continue;
      if (std::isinf(h) && c == h) continue;
      ADD_FAILURE() << what << "[" << i << "]: host " << h << ", cuda " << c << " (tolerance "
                    << tolerance(i, h) << ")";
      if (++reported == 5) return;
    }
  }

  // Relative error at most `relative`, measured against the element or, for
  // elements near zero after cancellation, the tensor's RMS.
  template <typename T>
  void ExpectClose(const Both<T>& both, const std::string& what, double relative = 1e-5) {
    const std::vector<T> host = HostValues(both);
    double squares = 0.0;
    for (T v : host) squares += static_cast<double>(v) * v;
    const double rms = host.empty() ? 0.0 : std::sqrt(squares / static_cast<double>(host.size()));
    ExpectNear(both, what, [&](size_t, double h) {
      return relative * std::max({std::fabs(h), rms, 1e-30});
    });
  }

  HostDevice host_;
  std::unique_ptr<CudaDevice> cuda_;
  std::unique_ptr<Stream> host_stream_;
  std::unique_ptr<Stream> cuda_stream_;
  std::mt19937 rng_;

 private:
  template <typename T>
  Both<T> Allocate(size_t count) {
    const size_t bytes = std::max<size_t>(count * sizeof(T), 1);
    absl::StatusOr<DeviceBuffer> host =
        host_.Allocate(bytes, *host_stream_, MemoryKind::kActivations, nullptr);
    absl::StatusOr<DeviceBuffer> cuda =
        cuda_->Allocate(bytes, *cuda_stream_, MemoryKind::kActivations, nullptr);
    EXPECT_TRUE(host.ok() && cuda.ok());
    Both<T> both{host->span<T>().first(count), cuda->span<T>().first(count)};
    buffers_.push_back(std::move(*host));
    buffers_.push_back(std::move(*cuda));
    return both;
  }

  template <typename T>
  static std::string Printable(T value) {
    if constexpr (std::is_floating_point_v<T>) {
      uint64_t bits = 0;
      std::memcpy(&bits, &value, sizeof(T));
      return absl::StrCat(value, " (bits 0x", absl::Hex(bits), ")");
    } else {
      return absl::StrCat(static_cast<int64_t>(value));
    }
  }

  // Declared last: released before the streams they belong to.
  std::vector<DeviceBuffer> buffers_;
};

}  // namespace flatshard::cuda::testing

#endif  // FLATSHARD_TESTS_UNIT_WORKER_CUDA_STREAM_TEST_UTIL_H_
