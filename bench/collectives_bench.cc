// All-gather and reduce-scatter through the FSDP unit runtime (FlatParamUnit:
// low-precision cast, buffer allocation, the collective, the compute view /
// gradient accumulation) against raw Gloo moving the same bytes, in W real
// processes on loopback. Also Gloo's ReduceScatterHalvingDoubling against our
// ring reduce-scatter (timing only: its results are wrong, see bench/CEILINGS.md).
// The unit reduce (issue #14: cast, pre-divide, pad, reduce-scatter,
// post-divide, accumulate) is held against the bare ring in place on a buffer
// of the same bytes, its ceiling; the ring's out-of-place form (one working
// copy in, one chunk out, as the unit's result goes to the gradient shard) is
// shown beside it. The three are timed interleaved (in place, copying, unit,
// ...) and each ratio is the median of the per-iteration ones.
// The gradient the backward leaves (allocated and zeroed by EnsureGrad) is set
// up outside the timed region; the gradient shard is cleared before each
// reduction, as every training step starts without one.
// The last five columns are the same over the same-host collectives
// (SameHostCommunicator: each rank reads its peers' buffers with
// process_vm_readv, Gloo carrying only the addresses and barriers), which the
// runtime uses where the ranks share a host: the bare all-gather, the unit's,
// and the unit reduce against the bare same-host reduce-scatter, in place and
// copying. --skip-gloo measures only these.
// Prints a markdown table; busbw follows nccl-tests: (W-1)/W * bytes / time.
//
//   collectives_bench [--sizes-mib 1,16,64] [--worlds 2,4] [--iters 10]
//                     [--reduce-dtype float32|bfloat16|float16] [--skip-gloo]
//                     (--help)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <unistd.h>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

#include "bench/bench_flags.h"
#include "bench/forked_ranks.h"
#include "core/dtype.h"
#include "core/flat_param_layout.h"
#include "worker/comm/file_store.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/gloo_store_adapter.h"
#include "worker/comm/host_collectives.h"
#include "worker/comm/same_host_communicator.h"
#include "worker/device/host/block_cache.h"
#include "worker/device/host/host_device.h"
#include "worker/runtime/flat_param_unit.h"

namespace flatshard {
namespace {

using Clock = std::chrono::steady_clock;

struct Timings {
  double raw_allgather = 0, unit_gather = 0, ring_reduce_scatter = 0, ring_in_place = 0,
         unit_reduce = 0, halving_doubling = 0, unit_over_ring = 0, same_host_allgather = 0;
};

// `setup` runs before each iteration's barrier, outside the timed region.
template <typename Setup, typename Fn>
double MedianSeconds(int iters, Communicator& comm, Setup&& setup, Fn&& fn) {
  std::vector<double> times;
  setup();
  fn();  // warm up (connections, allocator)
  for (int i = 0; i < iters; ++i) {
    setup();
    (void)comm.Barrier();
    const auto start = Clock::now();
    fn();
    times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

template <typename Fn>
double MedianSeconds(int iters, Communicator& comm, Fn&& fn) {
  return MedianSeconds(
      iters, comm, [] {}, std::forward<Fn>(fn));
}

// The unit's all-gather and its gradient reduce over `comm`, and the bare
// in-place reduce-scatter of the same bytes they are held against.
struct UnitTimings {
  double gather = 0, in_place = 0, copying = 0, reduce = 0, reduce_over_in_place = 0,
         reduce_over_copying = 0;
};

absl::StatusOr<UnitTimings> MeasureUnit(Communicator& comm, int rank, int world, size_t total,
                                        int iters, DType reduce_dtype) {
  const size_t shard = total / static_cast<size_t>(world);
  FlatParamLayoutOptions layout_options;
  layout_options.world_size = world;
  auto layout = FlatParamLayout::Create(
      {{"w", {static_cast<int64_t>(total)}, DType::kFloat32, true}}, layout_options, "bench");
  if (!layout.ok()) return layout.status();
  MemoryTracker memory;
  UnitRuntimeConfig config{Unit{},
                           *layout,
                           rank,
                           ShardingStrategy::kFullShard,
                           ResolvedPrecision{DType::kFloat32, reduce_dtype},
                           ComputeGradientDivideFactors(world)};
  // The unit on the CPU device, as the runtime drives it: the collectives run
  // on the communication stream's thread, the compute stream waits for them.
  HostDevice host;
  std::unique_ptr<Stream> compute = *host.CreateStream(StreamRole::kCompute, "compute");
  std::unique_ptr<Stream> comm_stream = *host.CreateStream(StreamRole::kCommunication, "comm");
  std::unique_ptr<HostCollectives> collectives = HostCollectives::Borrowing(&comm);
  UnitPlacement placement{&host,   compute.get(), comm_stream.get(), &memory, collectives.get(),
                          nullptr, &comm};
  auto unit_or = FlatParamUnit::Create(config, placement);
  if (!unit_or.ok()) return unit_or.status();
  FlatParamUnit& unit = **unit_or;
  UnitTimings t;
  t.gather = MedianSeconds(iters, comm, [&] {
    (void)unit.Gather();
    (void)compute->Wait(unit.gathered());
    unit.Free();
  });
  // The unit reduce against its ceilings interleaved (A B C A B C ...): the
  // three share every iteration's conditions on this noisy machine, and each
  // ratio is the median of the per-iteration ratios. The in-place
  // reduce-scatter leaves its result in its input, dirty in the cache; the
  // copying one writes it to a buffer of its own, as the unit must (the
  // gradient shard outlives the unsharded gradient). Each step of a training run
  // starts without a gradient shard (zero_grad), so the setup clears it: the
  // reduction writes the shard, as the first micro-batch of a step does.
  // The ceiling reduces the same elements in the reduce dtype (ones).
  const size_t es = DTypeSize(reduce_dtype);
  // The ceiling's buffer comes from the CPU device's allocator, as the
  // unit's do (whole huge pages at these sizes): both sides on the same pages.
  std::vector<std::byte> ones(es * total);
  const std::unique_ptr<std::byte, std::function<void(std::byte*)>> scratch_block(
      BlockCache::Get().Take(es * total),
      [bytes = es * total](std::byte* b) { BlockCache::Get().Give(b, bytes); });
  const std::span<std::byte> scratch(scratch_block.get(), es * total);
  const std::unique_ptr<std::byte, std::function<void(std::byte*)>> output_block(
      BlockCache::Get().Take(es * shard),
      [bytes = es * shard](std::byte* b) { BlockCache::Get().Give(b, bytes); });
  for (size_t i = 0; i < total; ++i) {
    const float one = 1.0f;
    ConvertElements(DType::kFloat32, reinterpret_cast<const std::byte*>(&one), reduce_dtype,
                    ones.data() + i * es, 1);
  }
  std::vector<double> ring_times, copying_times, unit_times, ratios, copying_ratios;
  for (int i = -1; i < iters; ++i) {  // i = -1 warms up
    std::copy(ones.begin(), ones.end(), scratch.begin());
    (void)comm.Barrier();
    auto start = Clock::now();
    (void)comm.ReduceScatterInPlace(scratch.data(), shard, reduce_dtype);
    const double ring = std::chrono::duration<double>(Clock::now() - start).count();
    std::copy(ones.begin(), ones.end(), scratch.begin());
    (void)comm.Barrier();
    start = Clock::now();
    (void)comm.ReduceScatter(scratch.data(), output_block.get(), shard, reduce_dtype);
    const double copying = std::chrono::duration<double>(Clock::now() - start).count();
    unit.ClearGradShard();
    (void)unit.EnsureGrad();
    (void)compute->Synchronize();
    (void)comm.Barrier();
    start = Clock::now();
    (void)comm_stream->Wait(**compute->Record());
    (void)unit.ReduceGrad();
    (void)comm_stream->Synchronize();
    const double reduce = std::chrono::duration<double>(Clock::now() - start).count();
    if (i < 0) continue;
    ring_times.push_back(ring);
    copying_times.push_back(copying);
    unit_times.push_back(reduce);
    ratios.push_back(ring / reduce);
    copying_ratios.push_back(copying / reduce);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  t.in_place = median(ring_times);
  t.reduce = median(unit_times);
  t.reduce_over_in_place = median(ratios);
  t.copying = median(copying_times);
  t.reduce_over_copying = median(copying_ratios);
  return t;
}

int RunRank(const std::string& dir, int rank, int world, size_t bytes, int iters,
            DType reduce_dtype, bool skip_gloo, const std::string& out_path) {
  auto store = FileStore::Open(dir);
  GlooOptions options;
  options.timeout = absl::Seconds(120);
  auto comm_or = GlooCommunicator::Create(*store, rank, world, options);
  if (!comm_or.ok()) {
    std::cerr << comm_or.status() << "\n";
    return 1;
  }
  GlooCommunicator& comm = **comm_or;
  // A raw Gloo context of its own, for the baseline.
  auto device = gloo::transport::tcp::CreateDevice(gloo::transport::tcp::attr("127.0.0.1"));
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, world);
  GlooStoreAdapter adapter(*store, "raw", absl::Seconds(120));
  context->connectFullMesh(adapter, device);

  const size_t total =
      bytes / sizeof(float) / static_cast<size_t>(world) * static_cast<size_t>(world);
  const size_t shard = total / static_cast<size_t>(world);
  Timings t;
  std::vector<float> in(shard, 1.0f), out(total);
  if (!skip_gloo) {
    t.raw_allgather = MedianSeconds(iters, comm, [&] {
      gloo::AllgatherOptions opts(context);
      opts.setInput(in.data(), shard);
      opts.setOutput(out.data(), total);
      gloo::allgather(opts);
    });
    absl::StatusOr<UnitTimings> gloo_unit =
        MeasureUnit(comm, rank, world, total, iters, reduce_dtype);
    if (!gloo_unit.ok()) {
      std::cerr << gloo_unit.status() << "\n";
      return 1;
    }
    t.unit_gather = gloo_unit->gather;
    t.ring_in_place = gloo_unit->in_place;
    t.ring_reduce_scatter = gloo_unit->copying;
    t.unit_reduce = gloo_unit->reduce;
    t.unit_over_ring = gloo_unit->reduce_over_in_place;
    std::vector<float> full(total, 1.0f);
    std::vector<int> recv_elems(static_cast<size_t>(world), static_cast<int>(shard));
    t.halving_doubling = MedianSeconds(iters, comm, [&] {
      gloo::ReduceScatterHalvingDoubling<float> hd(context, {full.data()}, static_cast<int>(total),
                                                   recv_elems);
      hd.run();
    });
  }

  options.prefix = "same-host";
  auto same_host_or = GlooCommunicator::Create(*store, rank, world, options);
  if (!same_host_or.ok()) return 1;
  std::string why_not;
  auto wrapped = SameHostCommunicator::Wrap(*std::move(same_host_or), SameHostOptions{}, &why_not);
  if (!wrapped.ok() || !why_not.empty()) {
    std::cerr << "same-host collectives unavailable: " << why_not << "\n";
    return 1;
  }
  Communicator& same_host = **wrapped;
  t.same_host_allgather = MedianSeconds(iters, same_host, [&] {
    (void)same_host.AllGather(out.data() + static_cast<size_t>(rank) * shard, out.data(), shard,
                              DType::kFloat32);
  });
  absl::StatusOr<UnitTimings> same_host_unit =
      MeasureUnit(same_host, rank, world, total, iters, reduce_dtype);
  if (!same_host_unit.ok()) {
    std::cerr << same_host_unit.status() << "\n";
    return 1;
  }

  if (rank == 0) {
    std::ofstream outf(out_path);
    outf << t.raw_allgather << " " << t.unit_gather << " " << t.ring_reduce_scatter << " "
         << t.ring_in_place << " " << t.unit_reduce << " " << t.halving_doubling << " "
         << t.unit_over_ring << " " << t.same_host_allgather << " " << same_host_unit->gather << " "
         << same_host_unit->in_place << " " << same_host_unit->reduce << " "
         << same_host_unit->reduce_over_in_place << " " << same_host_unit->copying << " "
         << same_host_unit->reduce_over_copying << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace flatshard

static int Main(int argc, char** argv) {
  std::vector<int> sizes = {1, 16, 64};
  std::vector<int> worlds = {2, 4};
  int iters = 10;
  CLI::App app{
      "collectives_bench: the FSDP unit's all-gather and gradient reduce (FlatParamUnit on the "
      "CPU device) against bare Gloo and the bare ring on the same bytes, in W processes on "
      "loopback; prints a markdown table (busbw as nccl-tests computes it)"};
  app.add_option("--sizes-mib", sizes, "Unsharded unit sizes in MiB")
      ->delimiter(',')
      ->check(flatshard::bench::AtLeastOne())
      ->capture_default_str();
  app.add_option("--worlds", worlds, "Process counts")
      ->delimiter(',')
      ->check(CLI::Range(2, 64))
      ->capture_default_str();
  app.add_option("--iters", iters, "Timed iterations per cell (medians; one warm-up more)")
      ->check(flatshard::bench::AtLeastOne())
      ->capture_default_str();
  std::string reduce_dtype_name = "float32";
  app.add_option("--reduce-dtype", reduce_dtype_name,
                 "The gradient's reduce dtype (the unit's mixed precision); the in-place ring "
                 "it is held against reduces the same elements in it")
      ->check(CLI::IsMember({"float32", "bfloat16", "float16"}))
      ->capture_default_str();
  bool skip_gloo = false;
  app.add_flag("--skip-gloo", skip_gloo,
               "Measure only the same-host columns (their Gloo counterparts print '-')");
  CLI11_PARSE(app, argc, argv);
  const flatshard::DType reduce_dtype = *flatshard::ParseDType(reduce_dtype_name);
  // The reduce columns move the gradient in the reduce dtype.
  const double reduce_share = static_cast<double>(flatshard::DTypeSize(reduce_dtype)) / 4.0;
  std::printf(
      "| W | size | raw gloo all-gather busbw | unit all-gather busbw | ratio | ring "
      "reduce-scatter busbw (copying) | ring in place busbw | unit reduce busbw | unit / in "
      "place | gloo halving-doubling RS busbw | same-host all-gather busbw | unit all-gather "
      "busbw, same-host | same-host in place busbw | same-host reduce-scatter busbw (copying) | "
      "unit reduce busbw, same-host | unit / in place, same-host | unit / copying, same-host "
      "|\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int world : worlds) {
    for (int mib : sizes) {
      const size_t bytes = static_cast<size_t>(mib) << 20;
      const std::string dir = absl::StrCat(std::filesystem::temp_directory_path().string(),
                                           "/flatshard-bench-", getpid(), "-", world, "-", mib);
      const std::string out = dir + ".out";
      const bool ok = flatshard::bench::RunForkedRanks(world, [&](int rank) {
        return flatshard::RunRank(dir, rank, world, bytes, iters, reduce_dtype, skip_gloo, out);
      });
      std::ifstream in(out);
      double t[14] = {};
      bool read = ok;
      for (double& v : t) read = read && static_cast<bool>(in >> v);
      if (!read) {
        std::fprintf(stderr, "W=%d %d MiB failed\n", world, mib);
        return 1;
      }
      const double factor =
          static_cast<double>(world - 1) / world * static_cast<double>(bytes) / 1e9;
      // A cell the run skipped (--skip-gloo) holds 0.
      auto bw = [&](double s, double share = 1.0) {
        return s == 0 ? std::string("-") : absl::StrFormat("%.2f GB/s", factor * share / s);
      };
      auto reduce_bw = [&](double s) { return bw(s, reduce_share); };
      auto ratio = [](double r) { return r == 0 ? std::string("-") : absl::StrFormat("%.2f", r); };
      const std::string row = absl::StrJoin(
          {absl::StrCat(world), absl::StrCat(mib, " MiB"), bw(t[0]), bw(t[1]),
           ratio(t[1] == 0 ? 0 : t[0] / t[1]), reduce_bw(t[2]), reduce_bw(t[3]), reduce_bw(t[4]),
           ratio(t[6]), bw(t[5]), bw(t[7]), bw(t[8]), reduce_bw(t[9]), reduce_bw(t[12]),
           reduce_bw(t[10]), ratio(t[11]), ratio(t[13])},
          " | ");
      std::printf("| %s |\n", row.c_str());
      std::fflush(stdout);
      std::filesystem::remove_all(dir);
      std::filesystem::remove(out);
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  return flatshard::bench::RunMain("collectives_bench", [&] { return Main(argc, argv); });
}
