// worker/comm/staged_collectives.h between real processes: Gloo collectives for
// device memory, staged through pinned host buffers, give the same results as
// the direct ones. They are device-neutral, so the strict simulated device runs
// them here and checks every copy, pinned-memory access and release they make
// (on a GPU they are `--comm gloo`, for ranks sharing a GPU).
#include "worker/comm/staged_collectives.h"

#include <cmath>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

#include "tests/integration/multiprocess.h"
#include "worker/comm/file_store.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/device/sim/sim_device.h"

namespace flatshard {
namespace {

constexpr int kWorld = 3;
constexpr size_t kCount = 1001;  // odd: no accidental alignment

std::vector<float> Values(int rank, size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = scale * static_cast<float>(rank + 1) + 0.25f * static_cast<float>(i % 7);
  }
  return v;
}

int Body(const std::string& dir, int rank) {
  auto store = FileStore::Open(dir);
  CHILD_OK(store.status());
  GlooOptions gloo;
  gloo.timeout = absl::Seconds(60);
  auto comm = GlooCommunicator::Create(*store, rank, kWorld, gloo);
  CHILD_OK(comm.status());
  SimOptions options;
  options.seed = static_cast<uint64_t>(rank) + 11;
  SimDevice device(options);
  auto stream = device.CreateStream(StreamRole::kCommunication, "comm");
  CHILD_OK(stream.status());
  Stream& s = **stream;
  std::unique_ptr<StagedCollectives> staged = StagedCollectives::Borrowing(&device, comm->get());
  auto buffer = [&](size_t floats) {
    return device.Allocate(floats * sizeof(float), s, MemoryKind::kActivations, nullptr);
  };
  auto upload = [&](DeviceBuffer& b, const std::vector<float>& v) {
    return s.CopyToDevice(b.byte_span(), std::as_bytes(std::span(v)));
  };
  auto download = [&](const DeviceBuffer& b) -> absl::StatusOr<std::vector<float>> {
    std::vector<float> v(b.bytes() / sizeof(float));
    absl::Status copied = s.CopyToHost(std::as_writable_bytes(std::span(v)), b.byte_span());
    if (!copied.ok()) return copied;
    return v;
  };

  // All-gather: rank r's chunk lands at r * kCount.
  auto in = buffer(kCount);
  auto gathered = buffer(kCount * kWorld);
  CHILD_OK(in.status());
  CHILD_OK(gathered.status());
  CHILD_OK(upload(*in, Values(rank, kCount, 1.0f)));
  CHILD_OK(staged->AllGather(s, in->byte_span(), gathered->byte_span(), kCount, DType::kFloat32));
  auto all = download(*gathered);
  CHILD_OK(all.status());
  for (int r = 0; r < kWorld; ++r) {
    const std::vector<float> want = Values(r, kCount, 1.0f);
    CHILD_CHECK(
        std::equal(want.begin(), want.end(),
                   all->begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(r) * kCount)));
  }

  // Reduce-scatter: rank r gets the sum of every rank's chunk r.
  auto full = buffer(kCount * kWorld);
  auto mine = buffer(kCount);
  CHILD_OK(full.status());
  CHILD_OK(mine.status());
  CHILD_OK(upload(*full, Values(rank, kCount * kWorld, 2.0f)));
  CHILD_OK(staged->ReduceScatter(s, full->byte_span(), mine->byte_span(), kCount, DType::kFloat32));
  auto reduced = download(*mine);
  CHILD_OK(reduced.status());
  for (size_t i = 0; i < kCount; ++i) {
    float want = 0;
    for (int r = 0; r < kWorld; ++r) {
      want += Values(r, kCount * kWorld, 2.0f)[static_cast<size_t>(rank) * kCount + i];
    }
    CHILD_CHECK(std::fabs((*reduced)[i] - want) <= 1e-4f * std::fabs(want));
  }
  // In place: this rank's chunk of `full` ends as the same sums.
  CHILD_OK(staged->ReduceScatterInPlace(s, full->byte_span(), kCount, DType::kFloat32));
  auto in_place = download(*full);
  CHILD_OK(in_place.status());
  CHILD_CHECK(std::equal(
      reduced->begin(), reduced->end(),
      in_place->begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(rank) * kCount)));

  // All-reduce (in place) and broadcast from rank 2.
  CHILD_OK(upload(*in, Values(rank, kCount, 3.0f)));
  CHILD_OK(staged->AllReduce(s, in->byte_span(), kCount, DType::kFloat32, ReduceOp::kMax));
  auto maxed = download(*in);
  CHILD_OK(maxed.status());
  CHILD_CHECK(*maxed == Values(kWorld - 1, kCount, 3.0f));
  CHILD_OK(upload(*in, Values(rank, kCount, 4.0f)));
  CHILD_OK(staged->Broadcast(s, in->byte_span(), kCount, DType::kFloat32, 2));
  auto broadcast = download(*in);
  CHILD_OK(broadcast.status());
  CHILD_CHECK(*broadcast == Values(2, kCount, 4.0f));
  CHILD_OK(s.Synchronize());
  CHILD_OK(device.fault());
  return 0;
}

TEST(StagedCollectivesSimDeviceTest, MatchDirectGlooResultsUnderTheSimulatedDevice) {
  const std::string dir = testing::MakeTempDir("staged");
  auto results = testing::RunRanks(
      kWorld, [&](int rank) { return Body(dir, rank); }, absl::Seconds(120));
  EXPECT_TRUE(testing::AllRanksSucceeded(results));
}

}  // namespace
}  // namespace flatshard
