// The unit all-gather and gradient reduce-scatter through the FSDP runtime
// (FlatParamUnit on the device's streams: buffer allocation from the pool, the
// collective, the event the compute stream waits on; the reduce path's two
// fused passes) against the bare collective of the same process group on the
// same bytes, on any device: `cuda` (NCCL, one GPU per rank; the GPU check's
// target is the runtime >= 0.9x the bare NCCL call), `cpu` or `sim`. Times are
// device events around each call, medians of --iters after a warm-up, in W real
// processes. Prints a markdown table; busbw follows nccl-tests: (W-1)/W * bytes
// / time (for W = 1, bytes / time).
//
//   device_collectives_bench [--device cuda] [--comm auto|gloo|nccl] [--worlds 1,2]
//                            [--sizes-mib 1,16,64,256] [--iters 20] [--gpus 0,1,...]
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"

#include "bench/bench_flags.h"
#include "bench/forked_ranks.h"
#include "core/status_macros.h"
#include "worker/comm/file_store.h"
#include "worker/device/device_factory.h"
#include "worker/runtime/flat_param_unit.h"
#include "worker/runtime/runtime_groups.h"

namespace flatshard {
namespace {

struct Settings {
  DeviceOptions device;
  CommBackend comm = CommBackend::kAuto;
  std::vector<int> gpus;
  int iters = 20;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median seconds of `run` (which issues work and returns the events around it);
// every iteration starts together on every rank.
template <typename Run>
absl::StatusOr<double> Time(int iters, Communicator& barrier, Stream& s1, Stream& s2, Run&& run) {
  std::vector<double> times;
  for (int i = 0; i <= iters; ++i) {
    RETURN_IF_ERROR(s1.Synchronize());
    RETURN_IF_ERROR(s2.Synchronize());
    RETURN_IF_ERROR(barrier.Barrier());
    ASSIGN_OR_RETURN(auto events, run());
    RETURN_IF_ERROR(events.second->Synchronize());
    ASSIGN_OR_RETURN(const double seconds, events.second->SecondsSince(*events.first));
    if (i > 0) times.push_back(seconds);  // the first is the warm-up
  }
  return Median(times);
}

using EventPair = std::pair<std::shared_ptr<Event>, std::shared_ptr<Event>>;

absl::StatusOr<std::vector<double>> RunRank(const Settings& settings, const std::string& dir,
                                            int rank, int world, size_t bytes) {
  ASSIGN_OR_RETURN(std::shared_ptr<Store> store, FileStore::Open(dir));
  DeviceOptions device_options = settings.device;
  device_options.gpu = settings.gpus.empty()
                           ? rank
                           : settings.gpus[static_cast<size_t>(rank) % settings.gpus.size()];
  device_options.sim.seed = static_cast<uint64_t>(rank) + 1;
  ASSIGN_OR_RETURN(std::shared_ptr<Device> device, CreateDevice(device_options));
  RETURN_IF_ERROR(device->MakeCurrent());
  ASSIGN_OR_RETURN(std::unique_ptr<Stream> compute,
                   device->CreateStream(StreamRole::kCompute, "compute"));
  ASSIGN_OR_RETURN(std::unique_ptr<Stream> comm,
                   device->CreateStream(StreamRole::kCommunication, "comm"));
  ASSIGN_OR_RETURN(RankLayout ranks, ComputeRankLayout(ShardingStrategy::kFullShard, world, 0));
  GroupOptions group_options;
  group_options.backend = settings.comm;
  group_options.gloo.timeout = absl::Seconds(120);
  ASSIGN_OR_RETURN(RuntimeGroups groups,
                   ConnectRuntimeGroups(*device, store, rank, world, ranks, false, group_options));

  const size_t total = std::max<size_t>(bytes / sizeof(float) / world * world, world);
  const size_t shard = total / static_cast<size_t>(world);
  MemoryTracker memory;
  auto buffer = [&](size_t floats) {
    return device->Allocate(floats * sizeof(float), *comm, MemoryKind::kActivations, &memory);
  };
  ASSIGN_OR_RETURN(DeviceBuffer in, buffer(shard));
  ASSIGN_OR_RETURN(DeviceBuffer full, buffer(total));
  ASSIGN_OR_RETURN(DeviceBuffer out, buffer(shard));
  RETURN_IF_ERROR(comm->Zero(in.byte_span()));
  RETURN_IF_ERROR(comm->Zero(full.byte_span()));
  ASSIGN_OR_RETURN(std::shared_ptr<Event> zeroed, comm->Record());
  RETURN_IF_ERROR(compute->Wait(*zeroed));

  FlatParamLayoutOptions layout_options;
  layout_options.world_size = world;
  ASSIGN_OR_RETURN(
      FlatParamLayout layout,
      FlatParamLayout::Create({{"w", {static_cast<int64_t>(total)}, DType::kFloat32, true}},
                              layout_options, "bench"));
  UnitRuntimeConfig config{Unit{},
                           std::move(layout),
                           rank,
                           ShardingStrategy::kFullShard,
                           ResolvedPrecision{DType::kFloat32, DType::kFloat32},
                           ComputeGradientDivideFactors(world)};
  UnitPlacement placement{
      device.get(), compute.get(),          comm.get(), &memory, groups.world.get(),
      nullptr,      groups.host_world.get()};
  ASSIGN_OR_RETURN(std::unique_ptr<FlatParamUnit> unit, FlatParamUnit::Create(config, placement));
  Communicator& barrier = *groups.host_world;

  std::vector<double> t;
  ASSIGN_OR_RETURN(
      double raw_gather,
      Time(settings.iters, barrier, *compute, *comm, [&]() -> absl::StatusOr<EventPair> {
        ASSIGN_OR_RETURN(auto start, comm->Record());
        RETURN_IF_ERROR(groups.world->AllGather(*comm, in.byte_span(), full.byte_span(), shard,
                                                DType::kFloat32));
        ASSIGN_OR_RETURN(auto end, comm->Record());
        return EventPair{start, end};
      }));
  ASSIGN_OR_RETURN(double unit_gather, Time(settings.iters, barrier, *compute, *comm,
                                            [&]() -> absl::StatusOr<EventPair> {
                                              unit->Free();
                                              RETURN_IF_ERROR(comm->Wait(**compute->Record()));
                                              ASSIGN_OR_RETURN(auto start, comm->Record());
                                              RETURN_IF_ERROR(unit->Gather());
                                              RETURN_IF_ERROR(compute->Wait(unit->gathered()));
                                              ASSIGN_OR_RETURN(auto end, compute->Record());
                                              return EventPair{start, end};
                                            }));
  unit->Free();
  ASSIGN_OR_RETURN(
      double raw_reduce,
      Time(settings.iters, barrier, *compute, *comm, [&]() -> absl::StatusOr<EventPair> {
        ASSIGN_OR_RETURN(auto start, comm->Record());
        RETURN_IF_ERROR(groups.world->ReduceScatter(*comm, full.byte_span(), out.byte_span(), shard,
                                                    DType::kFloat32));
        ASSIGN_OR_RETURN(auto end, comm->Record());
        return EventPair{start, end};
      }));
  ASSIGN_OR_RETURN(double unit_reduce, Time(settings.iters, barrier, *compute, *comm,
                                            [&]() -> absl::StatusOr<EventPair> {
                                              // Each step's first reduction writes a
                                              // fresh shard (zero_grad(set_to_none)).
                                              unit->ClearGradShard();
                                              RETURN_IF_ERROR(unit->EnsureGrad().status());
                                              RETURN_IF_ERROR(comm->Wait(**compute->Record()));
                                              ASSIGN_OR_RETURN(auto start, comm->Record());
                                              RETURN_IF_ERROR(unit->ReduceGrad());
                                              ASSIGN_OR_RETURN(auto end, comm->Record());
                                              return EventPair{start, end};
                                            }));
  RETURN_IF_ERROR(compute->Wait(**comm->Record()));
  RETURN_IF_ERROR(compute->Synchronize());
  return std::vector<double>{raw_gather, unit_gather, raw_reduce, unit_reduce};
}

}  // namespace
}  // namespace flatshard

static int Main(int argc, char** argv) {
  flatshard::Settings settings;
  std::vector<int> sizes = {1, 16, 64, 256};
  std::vector<int> worlds = {1};
  std::string device = "cuda";
  std::string comm = "auto";
  CLI::App app{
      "device_collectives_bench: the runtime's unit all-gather and reduce-scatter against the "
      "bare collective on the same bytes, in W processes"};
  app.add_option("--device", device, "cuda | cpu | sim")
      ->check(flatshard::bench::ParsedBy(flatshard::ParseDeviceKind, "DEVICE"))
      ->capture_default_str();
  app.add_option("--comm", comm, "auto (nccl on cuda, gloo otherwise) | gloo | nccl")
      ->check(flatshard::bench::ParsedBy(flatshard::ParseCommBackend, "COMM"))
      ->capture_default_str();
  app.add_option("--worlds", worlds, "Process counts")
      ->delimiter(',')
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--sizes-mib", sizes, "Unsharded unit sizes in MiB")
      ->delimiter(',')
      ->check(flatshard::bench::AtLeastOne())
      ->capture_default_str();
  app.add_option("--iters", settings.iters, "Timed iterations per cell (median; one warm-up more)")
      ->check(flatshard::bench::AtLeastOne())
      ->capture_default_str();
  app.add_option("--gpus", settings.gpus, "The GPU of each rank (default: rank)")
      ->delimiter(',')
      ->check(flatshard::bench::AtLeastZero());
  CLI11_PARSE(app, argc, argv);
  settings.device.kind = *flatshard::ParseDeviceKind(device);
  settings.comm = *flatshard::ParseCommBackend(comm);
  std::printf(
      "| device | W | size | bare all-gather busbw | unit all-gather busbw | ratio | bare "
      "reduce-scatter busbw | unit reduce busbw | ratio "
      "|\n|---|---|---|---|---|---|---|---|---|\n");
  for (int world : worlds) {
    for (int mib : sizes) {
      const size_t bytes = static_cast<size_t>(mib) << 20;
      const std::string dir = absl::StrCat(std::filesystem::temp_directory_path().string(),
                                           "/flatshard-devbench-", getpid(), "-", world, "-", mib);
      const std::string out = dir + ".out";
      const bool ok = flatshard::bench::RunForkedRanks(world, [&](int rank) {
        auto t = flatshard::RunRank(settings, dir, rank, world, bytes);
        if (!t.ok()) {
          std::fprintf(stderr, "rank %d: %s\n", rank, std::string(t.status().message()).c_str());
          return 1;
        }
        if (rank == 0) {
          std::ofstream(out) << (*t)[0] << " " << (*t)[1] << " " << (*t)[2] << " " << (*t)[3]
                             << "\n";
        }
        return 0;
      });
      double t[4] = {};
      std::ifstream in(out);
      if (!ok || !(in >> t[0] >> t[1] >> t[2] >> t[3])) {
        std::fprintf(stderr, "W=%d %d MiB failed\n", world, mib);
        return 1;
      }
      const double factor =
          (world == 1 ? 1.0 : static_cast<double>(world - 1) / world) * static_cast<double>(bytes);
      auto gbps = [&](double s) { return factor / s / 1e9; };
      std::printf(
          "| %s | %d | %d MiB | %.1f GB/s | %.1f GB/s | %.2f | %.1f GB/s | %.1f GB/s | %.2f |\n",
          std::string(flatshard::DeviceKindName(settings.device.kind)).c_str(), world, mib,
          gbps(t[0]), gbps(t[1]), t[0] / t[1], gbps(t[2]), gbps(t[3]), t[2] / t[3]);
      std::fflush(stdout);
      std::filesystem::remove_all(dir);
      std::filesystem::remove(out);
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  return flatshard::bench::RunMain("device_collectives_bench", [&] { return Main(argc, argv); });
}
