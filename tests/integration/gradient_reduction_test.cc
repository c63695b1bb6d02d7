// The fused gradient reduction (Collectives::ReduceGradient as the host
// collectives run it: Communicator::ReduceScatterChunked over Gloo's ring with
// the FSDP gradient's chunks, worker/comm/gradient_chunks.h) between real
// processes. It must equal the three separate steps it replaces (prepare,
// in-place reduce-scatter, accumulate: the default ReduceGradient) bit for bit
// for every reduce dtype, divide factors that are and are not powers of two,
// gradients that fill the padded input or leave padding (a chunk partly or
// wholly past the gradient), a first gradient (written) and a later one
// (accumulated), at W = 1..4, and in float32 also in place on the gradient's
// own padded buffer; on the strict simulated device, which checks the fused
// operation's declared reads and writes like a kernel's. And the chunk
// contract every ReduceScatterChunked keeps, on the ring and on the same-host
// collectives.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

#include "core/float16.h"
#include "tests/integration/multiprocess.h"
#include "worker/comm/file_store.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/host_collectives.h"
#include "worker/comm/same_host_communicator.h"
#include "worker/device/sim/sim_device.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<GlooCommunicator> Connect(const std::string& dir, int rank, int world) {
  auto store = FileStore::Open(dir);
  if (!store.ok()) return nullptr;
  GlooOptions options;
  options.timeout = absl::Seconds(60);
  auto comm = GlooCommunicator::Create(*store, rank, world, options);
  return comm.ok() ? *std::move(comm) : nullptr;
}

// A gradient with what rounding and the divides must treat alike everywhere:
// signed zeros, subnormals, values that round differently in bf16 and fp16,
// large ones (fp16 overflow) and infinities.
std::vector<float> Gradient(int rank, size_t n) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) {
    const auto k = static_cast<float>((i * 7919 + static_cast<size_t>(rank) * 104729) % 2003);
    switch (i % 11) {
      case 0:
        g[i] = (rank % 2 == 0) ? 0.0f : -0.0f;
        break;
      case 1:
        g[i] = -0.0f;
        break;
      case 2:
        g[i] = 1.0e-40f * k;  // subnormal
        break;
      case 3:
        g[i] = 7.0e4f + k;  // past fp16's range
        break;
      case 4:
        g[i] = (i % 3 == 0) ? std::numeric_limits<float>::infinity() : 1.0f;
        break;
      default:
        g[i] = (k - 1000.0f) * 1.00000012f / 997.0f;
    }
  }
  return g;
}

struct Case {
  DType dtype;
  double pre, post;
  size_t grad_count;
  bool accumulate;
};

bool SameBits(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](float x, float y) { return SameBits(x, y); });
}

int FusedEqualsSeparateBody(const std::string& dir, int rank, int world) {
  auto comm = Connect(dir, rank, world);
  CHILD_CHECK(comm != nullptr);
  SimOptions options;
  options.seed = static_cast<uint64_t>(rank) + 5;
  SimDevice device(options);
  auto stream = device.CreateStream(StreamRole::kCommunication, "comm");
  CHILD_OK(stream.status());
  Stream& s = **stream;
  std::unique_ptr<HostCollectives> collectives = HostCollectives::Borrowing(comm.get());
  auto alloc = [&](size_t bytes) {
    return device.Allocate(bytes, s, MemoryKind::kGradients, nullptr);
  };

  constexpr size_t kCount = 1003;  // odd, and a few 64 KiB blocks at fp16
  const auto w = static_cast<size_t>(world);
  const size_t total = kCount * w;
  std::vector<Case> cases;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (auto [pre, post] : {std::pair{2.0, 2.0}, std::pair{2.0, 3.0}, std::pair{3.0, 1.0}}) {
      // Every chunk whole (the raw first send), the last chunk partly padded,
      // and (W > 1) the last chunk wholly padded and the one before partly.
      std::vector<size_t> counts = {total, total - 5};
      if (world > 1) counts.push_back(total - kCount - 17);
      for (size_t grad_count : counts) {
        for (bool accumulate : {false, true}) {
          cases.push_back({dtype, pre, post, grad_count, accumulate});
        }
      }
    }
  }
  for (const Case& c : cases) {
    const std::string label =
        absl::StrCat(DTypeName(c.dtype), " pre ", c.pre, " post ", c.post, " N ", c.grad_count,
                     c.accumulate ? " accumulate" : " first");
    const std::vector<float> grad_values = Gradient(rank, c.grad_count);
    // What the shard held before: a gradient accumulated earlier, or (first)
    // NaNs that must not leak into the result.
    std::vector<float> before(kCount);
    for (size_t i = 0; i < kCount; ++i) {
      before[i] = c.accumulate ? 0.5f * static_cast<float>(i % 13) - 3.0f
                               : std::numeric_limits<float>::quiet_NaN();
    }
    std::vector<std::vector<float>> results;
    // float32 also runs in place: the work buffer is the gradient's own,
    // padded with zeros (how FlatParamUnit holds a sharded gradient).
    std::vector<std::pair<bool, bool>> variants = {{true, false}, {false, false}};
    if (c.dtype == DType::kFloat32) variants.insert(variants.end(), {{true, true}, {false, true}});
    for (auto [fused, in_place] : variants) {
      auto grad = alloc((in_place ? total : c.grad_count) * sizeof(float));
      auto work = alloc(total * DTypeSize(c.dtype));
      auto shard = alloc(kCount * sizeof(float));
      CHILD_OK(grad.status());
      CHILD_OK(work.status());
      CHILD_OK(shard.status());
      std::vector<float> padded_values = grad_values;
      if (in_place) padded_values.resize(total, 0.0f);
      CHILD_OK(s.CopyToDevice(grad->byte_span(), std::as_bytes(std::span(padded_values))));
      CHILD_OK(s.CopyToDevice(shard->byte_span(), std::as_bytes(std::span(before))));
      const GradientReduction r{grad->span<const float>().first(c.grad_count),
                                c.dtype,
                                c.pre,
                                c.post,
                                in_place ? grad->byte_span() : work->byte_span(),
                                kCount,
                                shard->span<float>(),
                                c.accumulate};
      // The default is the three separate steps; HostCollectives fuses.
      CHILD_OK(fused ? collectives->ReduceGradient(s, r)
                     : collectives->Collectives::ReduceGradient(s, r));
      std::vector<float> out(kCount);
      CHILD_OK(s.CopyToHost(std::as_writable_bytes(std::span(out)), shard->byte_span()));
      CHILD_OK(s.Synchronize());
      results.push_back(std::move(out));
    }
    for (size_t v = 1; v < results.size(); ++v) {
      if (SameBits(results[0], results[v])) continue;
      for (size_t i = 0; i < kCount; ++i) {
        if (!SameBits(results[0][i], results[v][i])) {
          std::cerr << label << ": element " << i << " fused " << results[0][i] << " variant " << v
                    << " (separate, fused in place, separate in place) " << results[v][i] << "\n";
          break;
        }
      }
      return 1;
    }
    // And an independent check where the sum is exact in any order: an
    // element every rank holds as 1.0 (Gradient: i % 11 == 4, i % 3 != 0)
    // reduces to W / pre / post.
    if (c.dtype == DType::kFloat32 && c.pre == 2.0 && c.post == 2.0) {
      size_t j = 0;
      auto ones = [&](size_t global) { return global % 11 == 4 && global % 3 != 0; };
      while (j < kCount && !ones(static_cast<size_t>(rank) * kCount + j)) ++j;
      const size_t global = static_cast<size_t>(rank) * kCount + j;
      CHILD_CHECK(j < kCount);
      if (global < c.grad_count) {
        const float want = (c.accumulate ? before[j] : 0.0f) + static_cast<float>(world) / 4.0f;
        CHILD_CHECK(results[0][j] == want);
      }
    }
  }
  CHILD_OK(device.fault());
  return 0;
}

class GradientReductionTest : public ::testing::TestWithParam<int> {};

TEST_P(GradientReductionTest, SimDeviceFusedRingEqualsTheSeparateStepsBitForBit) {
  const int world = GetParam();
  const std::string dir = testing::MakeTempDir(absl::StrCat("grad-reduce-", world));
  auto results = testing::RunRanks(
      world, [&](int rank) { return FusedEqualsSeparateBody(dir, rank, world); },
      absl::Seconds(120));
  EXPECT_TRUE(testing::AllRanksSucceeded(results));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GradientReductionTest, ::testing::Values(1, 2, 3, 4));

// The chunk contract itself (communicator.h), through a recording
// ReduceScatterChunks, on Gloo's ring and on the same-host collectives (which
// read the peers' memory): every chunk's elements are produced exactly once
// (written, or sent raw and finished by the receiver or, same-host at W >= 3,
// by each reader as it reads), this rank's chunk is consumed exactly once,
// and the sums are right. Producing doubles the input, so a raw chunk its
// reader did not finish, or one it finished twice, shows in the sums. The raw
// chunks lie either in the caller's own memory or in place in `work` (a
// float32 gradient reduced on its own padded buffer).
enum class Transport { kGlooRing, kSameHost };
enum class RawChunks { kNone, kEvenInOwnMemory, kEvenInPlace };

class RecordingChunks final : public ReduceScatterChunks {
 public:
  // `work` holds the input too when the raw chunks lie in place.
  RecordingChunks(int rank, size_t count, int world, RawChunks raw, float* work)
      : count_(count), raw_(raw), work_(work) {
    input_.resize(count * static_cast<size_t>(world));
    for (size_t i = 0; i < input_.size(); ++i) input_[i] = Value(rank, i);
    if (raw == RawChunks::kEvenInPlace) std::copy(input_.begin(), input_.end(), work);
    consumed_.assign(count, -1.0f);
  }
  static float Value(int rank, size_t i) {
    return static_cast<float>(rank * 1000 + static_cast<int>(i % 97));
  }

  const std::byte* RawChunk(size_t chunk) override {
    if (raw_ == RawChunks::kNone || chunk % 2 != 0) return nullptr;
    const float* base = raw_ == RawChunks::kEvenInPlace ? work_ : input_.data();
    return reinterpret_cast<const std::byte*>(base + chunk * count_);
  }
  void Produce(size_t chunk, size_t begin, size_t n, std::byte* out) override {
    Touch(chunk, begin, n);
    auto* o = reinterpret_cast<float*>(out);
    for (size_t i = 0; i < n; ++i) o[i] = 2.0f * input_[chunk * count_ + begin + i];
  }
  // Another rank's elements: its sums show whether they were finished once.
  void FinishRaw(size_t chunk, size_t /*begin*/, size_t n, std::byte* values) override {
    if (RawChunk(chunk) == nullptr) wrong_raw_ = true;
    finished_ += n;
    auto* v = reinterpret_cast<float*>(values);
    for (size_t i = 0; i < n; ++i) v[i] *= 2.0f;
  }
  void ProduceAndAdd(size_t chunk, size_t begin, size_t n, const std::byte* received,
                     bool received_raw, std::byte* out) override {
    Touch(chunk, begin, n);
    if (received_raw && RawChunk(chunk) == nullptr) wrong_raw_ = true;
    const auto* r = reinterpret_cast<const float*>(received);
    auto* o = reinterpret_cast<float*>(out);
    const float finish = received_raw ? 2.0f : 1.0f;
    for (size_t i = 0; i < n; ++i) {
      o[i] = 2.0f * input_[chunk * count_ + begin + i] + finish * r[i];
    }
  }
  void Consume(size_t begin, size_t n, const std::byte* reduced) override {
    const auto* r = reinterpret_cast<const float*>(reduced);
    for (size_t i = 0; i < n; ++i) {
      if (consumed_[begin + i] != -1.0f) twice_ = true;
      consumed_[begin + i] = r[i];
    }
  }

  // Each (chunk, element) produced at most once: counted by ranges.
  void Touch(size_t chunk, size_t begin, size_t n) {
    for (size_t i = begin; i < begin + n; ++i) {
      if (!produced_.insert(chunk * count_ + i).second) twice_ = true;
    }
  }

  size_t count_;
  RawChunks raw_;
  float* work_;
  std::vector<float> input_;
  std::vector<float> consumed_;
  std::set<size_t> produced_;
  size_t finished_ = 0;
  bool twice_ = false;
  bool wrong_raw_ = false;
};

std::unique_ptr<Communicator> ConnectFor(Transport transport, const std::string& dir, int rank,
                                         int world) {
  std::unique_ptr<Communicator> ring = Connect(dir, rank, world);
  if (ring == nullptr || transport == Transport::kGlooRing) return ring;
  // min_bytes 0: every collective takes the same-host path, however small.
  std::string why_not;
  auto same_host = SameHostCommunicator::Wrap(std::move(ring), SameHostOptions{0}, &why_not);
  if (!same_host.ok() || dynamic_cast<SameHostCommunicator*>(same_host->get()) == nullptr) {
    std::cerr << "rank " << rank << ": no same-host collectives: "
              << (same_host.ok() ? why_not : same_host.status().ToString()) << "\n";
    return nullptr;
  }
  return *std::move(same_host);
}

int ChunkContractBody(Transport transport, const std::string& dir, int rank, int world) {
  auto comm = ConnectFor(transport, dir, rank, world);
  CHILD_CHECK(comm != nullptr);
  const auto w = static_cast<size_t>(world);
  const auto r = static_cast<size_t>(rank);
  // 70000 floats: more than one 64 KiB block in the consuming step.
  for (size_t count : {size_t{1}, size_t{333}, size_t{70000}}) {
    for (RawChunks raw : {RawChunks::kNone, RawChunks::kEvenInOwnMemory, RawChunks::kEvenInPlace}) {
      std::vector<float> work(count * w, -7.0f);
      RecordingChunks chunks(rank, count, world, raw, work.data());
      CHILD_OK(comm->ReduceScatterChunked(chunks, work.data(), count, DType::kFloat32));
      CHILD_CHECK(!chunks.twice_);
      CHILD_CHECK(!chunks.wrong_raw_);
      // The chunks a rank never produced: the one it sends first raw (the
      // ring, and same-host at W=2, where it is the one chunk its peer reads),
      // or, same-host from W=3, every raw chunk in place (its readers finish
      // them), of which this rank finishes its peers' copies of its own.
      const bool raw_sent = raw != RawChunks::kNone && (r + w - 1) % w % 2 == 0;
      size_t not_produced = world > 1 && raw_sent ? count : 0;
      size_t finished = 0;
      if (transport == Transport::kSameHost && world > 2) {
        not_produced = 0;
        if (raw == RawChunks::kEvenInPlace) {
          for (size_t c = 0; c < w; ++c) not_produced += c != r && c % 2 == 0 ? count : 0;
          finished = r % 2 == 0 ? (w - 1) * count : 0;
        }
      }
      CHILD_CHECK(chunks.produced_.size() == count * w - not_produced);
      CHILD_CHECK(chunks.finished_ == finished);
      for (size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int q = 0; q < world; ++q) {
          want += 2.0f * RecordingChunks::Value(q, r * count + i);
        }
        CHILD_CHECK(chunks.consumed_[i] == want);
      }
    }
  }
  return 0;
}

std::string ChunkedTestName(const ::testing::TestParamInfo<std::tuple<Transport, int>>& info) {
  return absl::StrCat("w", std::get<1>(info.param));
}

class ReduceScatterChunkedTest : public ::testing::TestWithParam<std::tuple<Transport, int>> {};

TEST_P(ReduceScatterChunkedTest, ProducesEveryChunkOnceAndConsumesTheSum) {
  // (Not a structured binding: clang 14's lambdas cannot capture one.)
  const Transport transport = std::get<0>(GetParam());
  const int world = std::get<1>(GetParam());
  const std::string dir = testing::MakeTempDir(
      absl::StrCat("chunked-", transport == Transport::kSameHost ? "same-host-" : "", world));
  auto results = testing::RunRanks(
      world, [&](int rank) { return ChunkContractBody(transport, dir, rank, world); },
      absl::Seconds(120));
  EXPECT_TRUE(testing::AllRanksSucceeded(results));
}

INSTANTIATE_TEST_SUITE_P(GlooRing, ReduceScatterChunkedTest,
                         ::testing::Combine(::testing::Values(Transport::kGlooRing),
                                            ::testing::Values(1, 2, 3, 4)),
                         ChunkedTestName);
INSTANTIATE_TEST_SUITE_P(SameHost, ReduceScatterChunkedTest,
                         ::testing::Combine(::testing::Values(Transport::kSameHost),
                                            ::testing::Values(2, 3, 4, 5)),
                         ChunkedTestName);

// Bad requests name the field and change nothing.
TEST(GradientReductionArgumentsTest, RejectsBuffersThatDoNotFit) {
  const std::string dir = testing::MakeTempDir("grad-reduce-args");
  auto comm = Connect(dir, 0, 1);
  ASSERT_NE(comm, nullptr);
  SimDevice device(SimOptions{});
  auto stream = device.CreateStream(StreamRole::kCommunication, "comm");
  ASSERT_TRUE(stream.ok());
  Stream& s = **stream;
  std::unique_ptr<HostCollectives> collectives = HostCollectives::Borrowing(comm.get());
  auto grad = device.Allocate(10 * sizeof(float), s, MemoryKind::kGradients, nullptr);
  auto work = device.Allocate(10 * sizeof(float), s, MemoryKind::kGradients, nullptr);
  auto shard = device.Allocate(10 * sizeof(float), s, MemoryKind::kGradients, nullptr);
  ASSERT_TRUE(grad.ok() && work.ok() && shard.ok());
  const GradientReduction good{grad->span<const float>(),
                               DType::kFloat32,
                               1.0,
                               1.0,
                               work->byte_span(),
                               10,
                               shard->span<float>(),
                               true};
  struct Bad {
    GradientReduction r;
    const char* field;
  };
  std::vector<Bad> bad;
  bad.push_back({good, "reduce_dtype"});
  bad.back().r.reduce_dtype = DType::kInt32;
  bad.push_back({good, "grad holds 10"});
  bad.back().r.count = 9;
  bad.back().r.grad_shard = shard->span<float>().first(9);
  bad.push_back({good, "work holds"});
  bad.back().r.work = work->byte_span().first(39);
  bad.push_back({good, "grad_shard holds 9"});
  bad.back().r.grad_shard = shard->span<float>().first(9);
  // In place only in float32 and from the gradient's first byte.
  auto padded = device.Allocate(11 * sizeof(float), s, MemoryKind::kGradients, nullptr);
  ASSERT_TRUE(padded.ok());
  bad.push_back({good, "work overlaps grad"});
  bad.back().r.grad = padded->span<const float>().first(10);
  bad.back().r.work = padded->byte_span().subspan(4, 40);
  bad.push_back({good, "reduce_dtype bfloat16, work at grad + 0"});
  bad.back().r.reduce_dtype = DType::kBFloat16;
  bad.back().r.grad = padded->span<const float>().first(10);
  bad.back().r.work = padded->byte_span();
  for (const Bad& b : bad) {
    for (bool fused : {true, false}) {
      absl::Status status = fused ? collectives->ReduceGradient(s, b.r)
                                  : collectives->Collectives::ReduceGradient(s, b.r);
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << b.field;
      EXPECT_THAT(status.message(), HasSubstr(b.field));
    }
  }
  EXPECT_TRUE(collectives->ReduceGradient(s, good).ok());
  GradientReduction in_place = good;
  in_place.work = grad->byte_span();
  EXPECT_TRUE(collectives->ReduceGradient(s, in_place).ok());
  EXPECT_TRUE(s.Synchronize().ok());
  EXPECT_TRUE(device.fault().ok());
}

}  // namespace
}  // namespace flatshard
