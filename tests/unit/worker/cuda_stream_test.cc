// The CUDA device against the CPU device (worker/device/host/), operation by
// operation, plus what only the CUDA device has to prove: events order two
// streams, timing, the caching pool, pinned memory, argument errors enqueue
// nothing, and, on machines without a GPU, that Create says so. The
// reductions, losses, optimizers and clipping are in
// cuda_stream_reduction_test.cc.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/dtype.h"
#include "tests/unit/worker/cuda_stream_test_util.h"
#include "worker/device/cuda/cuda_device.h"
#include "worker/device/cuda/cuda_status.h"

namespace flatshard::cuda::testing {
namespace {

using ::testing::HasSubstr;

TEST(CudaDeviceWithoutGpuTest, CreateSaysNoDeviceIsVisible) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is present";
  absl::StatusOr<std::unique_ptr<CudaDevice>> device = CudaDevice::Create(0);
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(device.status().message(), HasSubstr("no CUDA device is visible"));
  EXPECT_THAT(device.status().message(), HasSubstr("CUDA_VISIBLE_DEVICES"));
}

TEST(CudaDeviceTest, NamesItselfAndRefusesOrdinalsOutOfRange) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  absl::StatusOr<std::unique_ptr<CudaDevice>> device = CudaDevice::Create(0);
  ASSERT_TRUE(device.ok()) << device.status();
  EXPECT_EQ((*device)->kind(), DeviceKind::kCuda);
  EXPECT_FALSE((*device)->name().empty());
  const int count = CudaDeviceCount();
  absl::StatusOr<std::unique_ptr<CudaDevice>> beyond = CudaDevice::Create(count);
  EXPECT_EQ(beyond.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(beyond.status().message(), HasSubstr(absl::StrCat(count, " CUDA device")));
}

// ---- copies and casts

TEST_F(CudaStreamTest, CopyZeroAndOverlappingCopy) {
  const std::vector<float> values = Normal(1000);
  Both<float> src = Upload(values), dst = Poisoned<float>(1000), zeroed = Upload(values);
  Both<float> shifted = Upload(values);
  OnBoth([&](Stream& s, Side side) -> absl::Status {
    if (absl::Status c = s.Copy(AsWritableBytes(dst.on(side)), AsBytes(src.on(side))); !c.ok()) {
      return c;
    }
    if (absl::Status z = s.Zero(AsWritableBytes(zeroed.on(side).subspan(100, 300))); !z.ok()) {
      return z;
    }
    // Overlapping ranges: elements [0, 900) move to [100, 1000), as memmove.
    DeviceSpan<float> all = shifted.on(side);
    return s.Copy(AsWritableBytes(all.subspan(100, 900)), AsBytes(all.subspan(0, 900)));
  });
  ExpectBitEqual(dst, "copy");
  ExpectBitEqual(zeroed, "zero");
  ExpectBitEqual(shifted, "overlapping copy");
}

// Source values for a cast from `dtype`: random bit patterns for the 16-bit
// floats (every NaN, infinity and subnormal included), random and special
// values for the wider ones.
std::vector<std::byte> CastSource(DType dtype, size_t count, std::mt19937& rng) {
  std::vector<std::byte> bytes(count * DTypeSize(dtype));
  if (dtype == DType::kFloat16 || dtype == DType::kBFloat16) {
    std::uniform_int_distribution<uint32_t> bits(0, 0xFFFF);
    auto* out = reinterpret_cast<uint16_t*>(bytes.data());
    for (size_t i = 0; i < count; ++i) out[i] = static_cast<uint16_t>(bits(rng));
    return bytes;
  }
  const double specials[] = {0.0,
                             -0.0,
                             std::numeric_limits<double>::infinity(),
                             -std::numeric_limits<double>::infinity(),
                             std::numeric_limits<double>::quiet_NaN(),
                             65504.0,
                             65520.0,
                             1e-8,
                             5.96e-8,
                             3.0e-5,
                             1e-40,
                             3.4e38,
                             1e39,
                             1.0 + 1.0 / 512};
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> exponent(-30.0, 30.0);
  for (size_t i = 0; i < count; ++i) {
    const double value =
        i < std::size(specials) ? specials[i] : normal(rng) * std::exp2(exponent(rng));
    if (dtype == DType::kFloat64) {
      std::memcpy(bytes.data() + i * 8, &value, 8);
    } else {
      const auto single = static_cast<float>(value);
      std::memcpy(bytes.data() + i * 4, &single, 4);
    }
  }
  return bytes;
}

TEST_F(CudaStreamTest, CastsEveryFloatingPairBitForBit) {
  const DType dtypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16};
  const size_t count = 5000;
  for (DType from : dtypes) {
    for (DType to : dtypes) {
      SCOPED_TRACE(absl::StrCat(DTypeName(from), " -> ", DTypeName(to)));
      Both<std::byte> src = Upload(CastSource(from, count, rng_));
      Both<std::byte> dst = Poisoned<std::byte>(count * DTypeSize(to));
      OnBoth([&](Stream& s, Side side) {
        return s.Cast(from, src.on(side), to, dst.on(side), count);
      });
      // NaN payloads may differ through double (GPU conversions make canonical
      // NaNs); everything else is bit for bit.
      const std::vector<std::byte> host = HostValues(dst), cuda = CudaValues(dst);
      int reported = 0;
      for (size_t i = 0; i < count && reported < 5; ++i) {
        const double h = ReadElement(to, host.data(), i), c = ReadElement(to, cuda.data(), i);
        const size_t size = DTypeSize(to);
        const bool same = std::isnan(h) ? std::isnan(c)
                                        : std::memcmp(&host[i * size], &cuda[i * size], size) == 0;
        if (!same) {
          ADD_FAILURE() << "element " << i << ": host " << h << ", cuda " << c;
          ++reported;
        }
      }
    }
  }
}

TEST_F(CudaStreamTest, CastInPlaceNarrowsLikeTheHost) {
  const size_t count = 3000;
  Both<float> values = Upload(Normal(count));
  OnBoth([&](Stream& s, Side side) {
    DeviceSpan<std::byte> bytes = AsWritableBytes(values.on(side));
    return s.Cast(DType::kFloat32, bytes, DType::kBFloat16, bytes, count);
  });
  ExpectBitEqual(values, "in-place float32 -> bfloat16");
}

TEST_F(CudaStreamTest, GradientPathMatchesBitForBit) {
  for (DType reduce : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(DTypeName(reduce));
    const size_t count = 7777, padded = 8192;
    Both<float> grad = Upload(Normal(count, 3.0f));
    Both<std::byte> prepared = Poisoned<std::byte>(padded * DTypeSize(reduce));
    Both<float> acc = Upload(Normal(count));
    OnBoth([&](Stream& s, Side side) -> absl::Status {
      absl::Status p =
          s.PrepareGradForReduce(grad.on(side), reduce, prepared.on(side), padded, 6.0);
      if (!p.ok()) return p;
      return s.AccumulateReducedGrad(reduce, prepared.on(side), acc.on(side), 3.0);
    });
    ExpectBitEqual(prepared, "prepared");
    ExpectBitEqual(acc, "accumulated");
  }
}

// ---- GEMM

// At least one element, so every operand has an address.
size_t Elements(int64_t count) { return static_cast<size_t>(std::max<int64_t>(count, 1)); }

struct GemmCase {
  const char* name;
  bool trans_a, trans_b;
  int64_t m, n, k, pad, batch;
  float alpha, beta;
  int64_t stride_b_override = -1;  // -1: packed
  int64_t stride_c_override = -1;
};

TEST_F(CudaStreamTest, GemmMatchesTheHostBlas) {
  const GemmCase cases[] = {
      {"plain", false, false, 37, 29, 53, 0, 1, 1.0f, 0.0f},
      {"transposed, padded, beta", true, true, 33, 17, 65, 3, 1, 0.5f, 0.25f},
      {"trans_a batched", true, false, 16, 24, 8, 1, 3, 1.0f, 0.0f},
      {"trans_b batched", false, true, 9, 31, 40, 0, 4, 2.0f, 1.0f},
      {"shared b", false, false, 12, 10, 7, 0, 3, 1.0f, 0.0f, 0},
      {"k = 0 scales c", false, false, 5, 6, 0, 0, 1, 1.0f, 0.5f},
      {"outputs overlap", false, false, 4, 5, 6, 0, 3, 1.0f, 1.0f, -1, 0},
  };
  for (const GemmCase& t : cases) {
    SCOPED_TRACE(t.name);
    GemmArgs g;
    g.trans_a = t.trans_a;
    g.trans_b = t.trans_b;
    g.m = t.m;
    g.n = t.n;
    g.k = t.k;
    g.alpha = t.alpha;
    g.beta = t.beta;
    g.batch = t.batch;
    const int64_t a_rows = t.trans_a ? t.k : t.m, a_cols = t.trans_a ? t.m : t.k;
    const int64_t b_rows = t.trans_b ? t.n : t.k, b_cols = t.trans_b ? t.k : t.n;
    g.lda = a_cols + t.pad;
    g.ldb = b_cols + t.pad;
    g.ldc = t.n + t.pad;
    g.stride_a = a_rows * g.lda;
    g.stride_b = t.stride_b_override >= 0 ? t.stride_b_override : b_rows * g.ldb;
    g.stride_c = t.stride_c_override >= 0 ? t.stride_c_override : t.m * g.ldc;
    Both<float> a = Upload(Normal(Elements((t.batch - 1) * g.stride_a + a_rows * g.lda)));
    Both<float> b = Upload(Normal(Elements((t.batch - 1) * g.stride_b + b_rows * g.ldb)));
    const size_t c_size = Elements((t.batch - 1) * g.stride_c + t.m * g.ldc);
    // beta = 0 must not read C: poisoned. Otherwise C is an input.
    Both<float> c = t.beta == 0.0f ? Poisoned<float>(c_size) : Upload(Normal(c_size));
    OnBoth([&](Stream& s, Side side) {
      GemmArgs args = g;
      args.a = a.on(side);
      args.b = b.on(side);
      args.c = c.on(side);
      return s.Gemm(args);
    });
    if (t.pad == 0) {
      ExpectClose(c, "c");
    } else {
      // The padding columns of C are never written: compare the matrices only.
      const std::vector<float> host = HostValues(c), cuda = CudaValues(c);
      for (size_t i = 0; i < host.size(); ++i) {
        if (i % Elements(g.ldc) >= Elements(t.n)) continue;
        EXPECT_NEAR(cuda[i], host[i], 1e-5 * std::max(1.0f, std::fabs(host[i]))) << i;
      }
    }
  }
}

// ---- elementwise layer pieces

TEST_F(CudaStreamTest, ActivationsMatch) {
  const size_t count = 20000;
  const std::vector<float> x_values = Normal(count, 3.0f), dy_values = Normal(count);
  Both<float> x = Upload(x_values), dy = Upload(dy_values);
  for (Activation kind : {Activation::kRelu, Activation::kGeluErf, Activation::kGeluTanh}) {
    SCOPED_TRACE(static_cast<int>(kind));
    Both<float> y = Poisoned<float>(count), dx = Poisoned<float>(count);
    OnBoth([&](Stream& s, Side side) -> absl::Status {
      if (absl::Status f = s.ActivationForward(kind, x.on(side), y.on(side)); !f.ok()) return f;
      return s.ActivationBackward(kind, kind == Activation::kRelu ? y.on(side) : x.on(side),
                                  dy.on(side), dx.on(side));
    });
    if (kind == Activation::kRelu) {
      ExpectBitEqual(y, "relu");
      ExpectBitEqual(dx, "relu grad");
    } else {
      // Same element body, but erff/expf/tanhf come from CUDA's math library on
      // the GPU and from libm on the host, which may differ in the last bits
      // (CUDA documents up to 2 ulp for each); the GELU output moves by
      // |x| times that at most.
      ExpectNear(y, "gelu",
                 [&](size_t i, double) { return 1e-6 * (1.0 + std::fabs(x_values[i])); });
      ExpectNear(dx, "gelu grad", [&](size_t i, double) {
        return 1e-6 * (1.0 + std::fabs(x_values[i])) * (1.0 + std::fabs(dy_values[i]));
      });
    }
  }
}

TEST_F(CudaStreamTest, AddsAndColumnSumsMatchBitForBit) {
  const size_t rows = 300, cols = 70, period = 7;
  Both<float> acc = Upload(Normal(rows * cols)), x = Upload(Normal(rows * cols));
  Both<float> bias = Upload(Normal(cols)), column_sums = Upload(Normal(cols));
  Both<float> table = Upload(Normal(period * cols)), modulo_sums = Poisoned<float>(period * cols);
  OnBoth([&](Stream& s, Side side) -> absl::Status {
    if (absl::Status a = s.Add(acc.on(side), x.on(side)); !a.ok()) return a;
    if (absl::Status b = s.AddBias(acc.on(side), bias.on(side)); !b.ok()) return b;
    if (absl::Status r = s.AddRowsModulo(acc.on(side), table.on(side), period); !r.ok()) return r;
    if (absl::Status c = s.AccumulateColumnSums(acc.on(side), column_sums.on(side)); !c.ok()) {
      return c;
    }
    return s.SumRowsModulo(acc.on(side), period, modulo_sums.on(side));
  });
  ExpectBitEqual(acc, "add, bias, rows modulo");
  ExpectBitEqual(column_sums, "column sums");
  ExpectBitEqual(modulo_sums, "rows modulo sums");
}

TEST_F(CudaStreamTest, EmbeddingForwardAndHeadsMatchBitForBit) {
  const int64_t vocab = 50, dim = 24;
  const size_t tokens = 64;
  Both<int32_t> ids = Upload(Ints(tokens, vocab));
  Both<float> table = Upload(Normal(vocab * dim)), gathered = Poisoned<float>(tokens * dim);
  HeadLayout layout{
      .batch = 2, .seq = 5, .heads = 3, .head_dim = 4, .row_stride = 30, .col_offset = 12};
  Both<float> rows = Upload(Normal(2 * 5 * 30));
  Both<float> heads = Poisoned<float>(Elements(layout.elements()));
  Both<float> merged = Upload(Normal(2 * 5 * 30));
  OnBoth([&](Stream& s, Side side) -> absl::Status {
    absl::Status e = s.EmbeddingForward(ids.on(side), table.on(side), dim, gathered.on(side));
    if (!e.ok()) return e;
    if (absl::Status h = s.SplitHeads(rows.on(side), layout, heads.on(side)); !h.ok()) return h;
    return s.MergeHeads(heads.on(side), layout, merged.on(side));
  });
  ExpectBitEqual(gathered, "embedding");
  ExpectBitEqual(heads, "split heads");
  ExpectBitEqual(merged, "merged heads");
}

// ---- what only the CUDA device has to prove

TEST_F(CudaStreamTest, EventsOrderTwoStreams) {
  absl::StatusOr<std::unique_ptr<Stream>> other =
      cuda_->CreateStream(StreamRole::kCommunication, "cuda-communication");
  ASSERT_TRUE(other.ok()) << other.status();
  const size_t count = size_t{1} << 22;
  Both<float> ones = Upload(std::vector<float>(count, 1.0f));
  Both<float> acc = Upload(std::vector<float>(count, 0.0f)), seen = Poisoned<float>(count);
  absl::StatusOr<std::shared_ptr<Event>> start = cuda_stream_->Record();
  ASSERT_TRUE(start.ok()) << start.status();
  for (int i = 0; i < 32; ++i) ASSERT_TRUE(cuda_stream_->Add(acc.cuda, ones.cuda).ok());
  absl::StatusOr<std::shared_ptr<Event>> done = cuda_stream_->Record();
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_TRUE((*other)->Wait(**done).ok());
  ASSERT_TRUE((*other)->Copy(AsWritableBytes(seen.cuda), AsBytes(acc.cuda)).ok());
  // And back: the compute stream reads `seen` and releases every buffer, so it
  // waits for the copy first (the record-stream rule of device.h).
  absl::StatusOr<std::shared_ptr<Event>> copied_event = (*other)->Record();
  ASSERT_TRUE(copied_event.ok()) << copied_event.status();
  ASSERT_TRUE(cuda_stream_->Wait(**copied_event).ok());
  std::vector<float> copied(count);
  ASSERT_TRUE(
      cuda_stream_->CopyToHost(std::as_writable_bytes(std::span<float>(copied)), AsBytes(seen.cuda))
          .ok());
  ASSERT_TRUE(cuda_stream_->Synchronize().ok());
  EXPECT_EQ(std::count(copied.begin(), copied.end(), 32.0f), static_cast<ptrdiff_t>(count));
  ASSERT_TRUE((*done)->Synchronize().ok());
  absl::StatusOr<double> seconds = (*done)->SecondsSince(**start);
  ASSERT_TRUE(seconds.ok()) << seconds.status();
  EXPECT_GT(*seconds, 0.0);
  // An event of another device is refused.
  absl::StatusOr<std::shared_ptr<Event>> host_event = host_stream_->Record();
  ASSERT_TRUE(host_event.ok());
  EXPECT_EQ(cuda_stream_->Wait(**host_event).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaStreamTest, PoolReusesFreedMemory) {
  MemoryTracker tracker;
  const size_t bytes = size_t{64} << 20;
  const DeviceMemoryStats before = cuda_->MemoryStats();
  for (int i = 0; i < 10; ++i) {
    absl::StatusOr<DeviceBuffer> buffer =
        cuda_->Allocate(bytes, *cuda_stream_, MemoryKind::kGradients, &tracker);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    EXPECT_EQ(tracker.current(MemoryKind::kGradients), static_cast<int64_t>(bytes));
    ASSERT_TRUE(cuda_stream_->Zero(buffer->byte_span()).ok());
  }
  ASSERT_TRUE(cuda_stream_->Synchronize().ok());
  const DeviceMemoryStats after = cuda_->MemoryStats();
  EXPECT_EQ(tracker.current(MemoryKind::kGradients), 0);
  EXPECT_EQ(after.pool_in_use_bytes, before.pool_in_use_bytes);
  // Ten cycles grew the pool once at most, and the memory stays cached.
  EXPECT_LT(after.pool_reserved_bytes - before.pool_reserved_bytes,
            2 * static_cast<int64_t>(bytes));
  EXPECT_GE(after.pool_reserved_bytes, static_cast<int64_t>(bytes));
  EXPECT_GT(after.device_total_bytes, 0);
  // Out of memory is RESOURCE_EXHAUSTED and leaves the stream usable.
  absl::StatusOr<DeviceBuffer> huge =
      cuda_->Allocate(size_t{1} << 40, *cuda_stream_, MemoryKind::kActivations, nullptr);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  Both<float> acc = Upload(Normal(100)), x = Upload(Normal(100));
  OnBoth([&](Stream& s, Side side) { return s.Add(acc.on(side), x.on(side)); });
  ExpectBitEqual(acc, "add after out of memory");
}

TEST_F(CudaStreamTest, PinnedBufferRoundTrip) {
  const size_t count = 4096;
  absl::StatusOr<PinnedBuffer> in = cuda_->AllocatePinned(count * sizeof(float));
  absl::StatusOr<PinnedBuffer> out = cuda_->AllocatePinned(count * sizeof(float));
  ASSERT_TRUE(in.ok() && out.ok());
  const std::vector<float> values = Normal(count);
  absl::StatusOr<std::span<float>> writable = in->Write<float>();
  ASSERT_TRUE(writable.ok());
  std::copy(values.begin(), values.end(), writable->begin());
  Both<float> staged = Poisoned<float>(count);
  ASSERT_TRUE(cuda_stream_->CopyToDevice(AsWritableBytes(staged.cuda), in->copy_source()).ok());
  ASSERT_TRUE(cuda_stream_->CopyToHost(out->copy_target(), AsBytes(staged.cuda)).ok());
  ASSERT_TRUE(cuda_stream_->Synchronize().ok());
  absl::StatusOr<std::span<const float>> readable = out->Read<float>();
  ASSERT_TRUE(readable.ok());
  EXPECT_TRUE(std::equal(values.begin(), values.end(), readable->begin()));
  // A freed pinned block is handed out again for the same size.
  const std::byte* block = in->copy_source().data();
  *in = PinnedBuffer();
  absl::StatusOr<PinnedBuffer> again = cuda_->AllocatePinned(count * sizeof(float));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->copy_source().data(), block);
}

TEST_F(CudaStreamTest, ArgumentErrorsMatchTheHostAndEnqueueNothing) {
  Both<float> acc = Upload(Normal(16)), x = Upload(Normal(15));
  const absl::Status host = host_stream_->Add(acc.host, x.host);
  const absl::Status cuda = cuda_stream_->Add(acc.cuda, x.cuda);
  EXPECT_EQ(cuda.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda, host);
  GemmArgs g{.m = 4,
             .n = 4,
             .k = 4,
             .a = acc.cuda,
             .lda = 4,
             .b = x.cuda,
             .ldb = 4,
             .c = acc.cuda,
             .ldc = 4};
  EXPECT_EQ(cuda_stream_->Gemm(g).code(), absl::StatusCode::kInvalidArgument);
  // Nothing ran: the inputs are untouched, and the stream still works.
  ExpectBitEqual(acc, "acc after refused calls");
  EXPECT_TRUE(cuda_stream_->Synchronize().ok());
  Both<float> y = Upload(Normal(15));
  OnBoth([&](Stream& s, Side side) { return s.Add(y.on(side), x.on(side)); });
  ExpectBitEqual(y, "add after refused calls");
}

}  // namespace
}  // namespace flatshard::cuda::testing
