// Tests worker/device/sim/sim_device.h: the strict simulated device refuses
// every buffer use the issuing code did not order (docs/architecture.md §5),
// names both ends in the error, and computes what the CPU device computes when
// the use is ordered; and the CPU device's own rules beside them.
#include "worker/device/sim/sim_device.h"

#include <cstring>
#include <memory>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "worker/device/host/host_device.h"

namespace flatshard {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class SimDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SimOptions options;
    options.max_delay_us = 200;  // make unordered work really late
    device_ = std::make_unique<SimDevice>(options);
    a_ = *device_->CreateStream(StreamRole::kCompute, "compute");
    b_ = *device_->CreateStream(StreamRole::kCommunication, "comm");
  }

  DeviceBuffer Floats(Stream& stream, size_t n) {
    return *device_->Allocate(n * sizeof(float), stream, MemoryKind::kActivations, &memory_);
  }

  // Copies `values` into `buffer` on `stream` (a pageable copy: done on return).
  void Fill(Stream& stream, const DeviceBuffer& buffer, const std::vector<float>& values) {
    ASSERT_TRUE(stream.CopyToDevice(buffer.byte_span(), std::as_bytes(std::span(values))).ok());
  }

  std::vector<float> Read(Stream& stream, const DeviceBuffer& buffer) {
    std::vector<float> out(buffer.bytes() / sizeof(float));
    EXPECT_TRUE(stream.CopyToHost(std::as_writable_bytes(std::span(out)), buffer.byte_span()).ok());
    return out;
  }

  MemoryTracker memory_;
  std::unique_ptr<SimDevice> device_;
  std::unique_ptr<Stream> a_, b_;
};

TEST_F(SimDeviceTest, AnOrderedCrossStreamUseComputesLikeTheCpuDevice) {
  DeviceBuffer x = Floats(*a_, 4), y = Floats(*b_, 4);
  Fill(*a_, x, {-1, 0, 2, 3});
  auto ready = a_->Record();
  ASSERT_TRUE(ready.ok());
  ASSERT_TRUE(b_->Wait(**ready).ok());
  ASSERT_TRUE(b_->ActivationForward(Activation::kRelu, x.span<float>(), y.span<float>()).ok());
  EXPECT_EQ(Read(*b_, y), (std::vector<float>{0, 0, 2, 3}));
  ASSERT_TRUE(a_->Wait(**b_->Record()).ok());  // y's use on b is done before a releases x
}

TEST_F(SimDeviceTest, AMissingEventWaitIsRefusedNamingBothOperations) {
  DeviceBuffer x = Floats(*a_, 4), y = Floats(*a_, 4);
  ASSERT_TRUE(a_->Zero(x.byte_span()).ok());
  // b reads what a wrote without waiting for a's event.
  const absl::Status status =
      b_->ActivationForward(Activation::kRelu, x.span<float>(), y.span<float>());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr("ActivationForward on stream 'comm' reads buffer"),
                    HasSubstr("Zero (operation #"), HasSubstr("on stream 'compute'"),
                    HasSubstr("without waiting for an event recorded after it")));
}

TEST_F(SimDeviceTest, AllocationIsOrderedOnItsStreamOnly) {
  DeviceBuffer x = Floats(*a_, 4);
  // Memory allocated on a may not be touched by b before an event after it.
  EXPECT_EQ(b_->Zero(x.byte_span()).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(b_->Wait(**a_->Record()).ok());
  EXPECT_TRUE(b_->Zero(x.byte_span()).ok());
}

TEST_F(SimDeviceTest, WritingWhatAnotherStreamStillReadsIsRefused) {
  DeviceBuffer x = Floats(*a_, 4), y = Floats(*b_, 4);
  ASSERT_TRUE(a_->Zero(x.byte_span()).ok());
  ASSERT_TRUE(b_->Wait(**a_->Record()).ok());
  ASSERT_TRUE(b_->Copy(y.byte_span(), x.byte_span()).ok());  // b reads x
  // a overwrites x while b's read may still be running.
  const absl::Status status = a_->Zero(x.byte_span());
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr("Zero on stream 'compute' writes"), HasSubstr("still read by Copy")));
  ASSERT_TRUE(b_->Synchronize().ok());  // x may now be released on compute
}

TEST_F(SimDeviceTest, HostSynchronizationOrdersLaterWork) {
  DeviceBuffer x = Floats(*a_, 4), y = Floats(*b_, 4);
  ASSERT_TRUE(a_->Zero(x.byte_span()).ok());
  ASSERT_TRUE(a_->Synchronize().ok());  // the host saw a's work complete
  EXPECT_TRUE(b_->Copy(y.byte_span(), x.byte_span()).ok());
  ASSERT_TRUE(b_->Synchronize().ok());
}

TEST_F(SimDeviceTest, HostPointersAndReleasedOrOutOfBoundsMemoryAreRefused) {
  std::vector<float> host(4, 1.0f);
  DeviceBuffer y = Floats(*a_, 4);
  const DeviceSpan<const float> host_span(host.data(), host.size());
  EXPECT_THAT(
      std::string(a_->ActivationForward(Activation::kRelu, host_span, y.span<float>()).message()),
      HasSubstr("not inside a live allocation of this device (a host pointer"));
  const DeviceSpan<float> beyond(y.span<float>().address(), 5);
  EXPECT_EQ(a_->Zero(AsWritableBytes(beyond)).code(), absl::StatusCode::kFailedPrecondition);
  const DeviceSpan<float> stale = y.span<float>();
  y.Release(*a_);
  EXPECT_THAT(std::string(a_->Zero(AsWritableBytes(stale)).message()),
              HasSubstr("released memory"));
}

TEST_F(SimDeviceTest, DeviceAddressesAreNotHostAddresses) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the device's streams are threads
  DeviceBuffer x = Floats(*a_, 4);
  const auto address = reinterpret_cast<uintptr_t>(x.span<float>().address());
  // Non-canonical on x86-64: bits 63..47 are neither all zero nor all one, so a
  // host dereference faults instead of reading device memory by accident.
  EXPECT_NE(address >> 47, 0u);
  EXPECT_NE(address >> 47, (uintptr_t{1} << 17) - 1);
  EXPECT_DEATH(
      {
        volatile float v = *x.span<float>().address();
        (void)v;
      },
      "");
}

TEST_F(SimDeviceTest, ReleasingOnTheWrongStreamFaultsTheDevice) {
  DeviceBuffer x = Floats(*a_, 4), y = Floats(*b_, 4);
  ASSERT_TRUE(a_->Zero(x.byte_span()).ok());
  ASSERT_TRUE(b_->Wait(**a_->Record()).ok());
  ASSERT_TRUE(b_->Copy(y.byte_span(), x.byte_span()).ok());  // last use of x: on b
  x.Release(*a_);  // the record-stream bug: a has not waited for b's read
  const absl::Status fault = device_->fault();
  EXPECT_THAT(
      std::string(fault.message()),
      AllOf(HasSubstr("released on stream 'compute' while Copy"), HasSubstr("on stream 'comm'")));
  // Every later operation reports it.
  EXPECT_EQ(a_->Zero(y.byte_span()).code(), fault.code());
}

TEST_F(SimDeviceTest, PinnedMemoryIsReadOnlyAfterTheCopyIsKnownComplete) {
  DeviceBuffer x = Floats(*a_, 2);
  Fill(*a_, x, {4, 5});
  PinnedBuffer pinned = *device_->AllocatePinned(2 * sizeof(float));
  ASSERT_TRUE(a_->CopyToHost(pinned.copy_target(), x.byte_span()).ok());
  // An asynchronous copy: reading before synchronizing is a race.
  EXPECT_THAT(std::string(std::as_const(pinned).Read<float>().status().message()),
              HasSubstr("the host reads pinned memory"));
  ASSERT_TRUE(a_->Synchronize().ok());
  auto values = std::as_const(pinned).Read<float>();
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ((*values)[0], 4.0f);
  EXPECT_EQ((*values)[1], 5.0f);
}

TEST_F(SimDeviceTest, FreshMemoryReadsAsNaNUntilWritten) {
  DeviceBuffer x = Floats(*a_, 3);
  for (float v : Read(*a_, x)) EXPECT_TRUE(std::isnan(v));
}

TEST_F(SimDeviceTest, AFailedOperationFailsTheEventsAfterIt) {
  DeviceBuffer x = Floats(*a_, 4);
  ASSERT_TRUE(static_cast<HostExecStream&>(*a_)
                  .Submit("Broken", {WriteOf(x.span<float>())},
                          [](const ResolvedAccesses&) { return absl::InternalError("boom"); })
                  .ok());
  auto event = a_->Record();
  ASSERT_TRUE(event.ok());
  EXPECT_THAT(std::string((*event)->Synchronize().message()), HasSubstr("Broken: boom"));
  ASSERT_TRUE(b_->Wait(**event).ok());
  EXPECT_THAT(std::string(b_->Synchronize().message()), HasSubstr("boom"));
}

// Only a device whose memory is host memory adopts pinned blocks; the sim
// device, like a GPU, refuses (callers copy instead) and changes nothing.
TEST_F(SimDeviceTest, PinnedMemoryIsNotAdoptedAsDeviceMemory) {
  EXPECT_FALSE(device_->memory_is_host_memory());
  DeviceBuffer target = Floats(*a_, 2);
  Fill(*a_, target, {1, 2});
  const absl::Status adopted =
      device_->AdoptPinned(*device_->AllocatePinned(2 * sizeof(float)), target);
  EXPECT_EQ(adopted.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(adopted.message()), HasSubstr("copy the values instead"));
  EXPECT_EQ(Read(*a_, target), (std::vector<float>{1, 2}));
}

// On the CPU device pinned memory and device memory are the same blocks: the
// pinned block itself becomes the buffer (no copy; a checkpoint load's staged
// values become the shards), accounted as the buffer's kind and as device
// memory, no longer pinned; the buffer's old block is released. Another size,
// or pinned memory of another device, is refused with nothing changed.
TEST(HostDeviceTest, AdoptPinnedMakesTheBlockTheBufferWithoutACopy) {
  HostDevice device;
  auto compute = *device.CreateStream(StreamRole::kCompute, "compute");
  MemoryTracker memory;
  DeviceBuffer target =
      *device.Allocate(4 * sizeof(float), *compute, MemoryKind::kShardedParams, &memory);
  PinnedBuffer pinned = *device.AllocatePinned(4 * sizeof(float));
  std::span<float> values = *pinned.Write<float>();
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) + 0.5f;
  const int64_t in_use = device.MemoryStats().pool_in_use_bytes;

  HostDevice other;
  EXPECT_EQ(device.AdoptPinned(*other.AllocatePinned(4 * sizeof(float)), target).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(device.AdoptPinned(*device.AllocatePinned(8), target).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_NE(HostDevice::HostAddress(target.span<float>()), values.data());

  ASSERT_TRUE(device.AdoptPinned(std::move(pinned), target).ok());
  EXPECT_EQ(HostDevice::HostAddress(target.span<float>()), values.data());
  EXPECT_EQ(HostDevice::HostAddress(target.span<float>())[3], 3.5f);
  EXPECT_FALSE(device.IsPinned(values.data(), values.size_bytes()));
  EXPECT_EQ(device.MemoryStats().pool_in_use_bytes, in_use);  // one block in, one out
  EXPECT_EQ(memory.current(MemoryKind::kShardedParams), 4 * int64_t{sizeof(float)});
  target.Release();
  EXPECT_EQ(device.MemoryStats().pool_in_use_bytes, in_use - 4 * int64_t{sizeof(float)});
  EXPECT_EQ(memory.current(MemoryKind::kShardedParams), 0);
}

TEST(HostDeviceTest, TheComputeStreamRunsInlineAndTheOtherWaitsForIt) {
  HostDevice device;
  auto compute = *device.CreateStream(StreamRole::kCompute, "compute");
  auto comm = *device.CreateStream(StreamRole::kCommunication, "comm");
  DeviceBuffer x = *device.Allocate(16, *compute, MemoryKind::kActivations, nullptr);
  ASSERT_TRUE(compute->Zero(x.byte_span()).ok());
  // Inline: done on return, readable through the host address.
  EXPECT_EQ(*HostDevice::HostAddress(x.span<float>()), 0.0f);
  std::vector<float> ones(4, 1.0f);
  ASSERT_TRUE(comm->CopyToDevice(x.byte_span(), std::as_bytes(std::span(ones))).ok());
  auto done = comm->Record();
  ASSERT_TRUE(done.ok());
  ASSERT_TRUE(compute->Wait(**done).ok());  // blocks until comm's thread got there
  EXPECT_EQ(HostDevice::HostAddress(x.span<float>())[3], 1.0f);
  auto start = compute->Record();
  auto end = compute->Record();
  EXPECT_GE(*(*end)->SecondsSince(**start), 0.0);
}

TEST(StreamChecksTest, BadShapesAreRefusedBeforeAnythingIsIssued) {
  HostDevice device;
  auto compute = *device.CreateStream(StreamRole::kCompute, "compute");
  DeviceBuffer a = *device.Allocate(6 * sizeof(float), *compute, MemoryKind::kActivations, nullptr);
  GemmArgs g;
  g.m = 2, g.n = 2, g.k = 3;
  g.a = a.span<float>(), g.lda = 3;
  g.b = a.span<float>().first(4), g.ldb = 2;  // needs 3x2
  g.c = a.span<float>(), g.ldc = 2;
  EXPECT_THAT(std::string(compute->Gemm(g).message()),
              HasSubstr("Gemm: operand b holds 4 floats, needs 6"));
  EXPECT_THAT(std::string(compute->AddBias(a.span<float>(), a.span<float>().first(4)).message()),
              HasSubstr("6 elements are not whole rows of 4"));
}

}  // namespace
}  // namespace flatshard
