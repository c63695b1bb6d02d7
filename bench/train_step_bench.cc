// Training-step time breakdown of the FSDP data plane: W worker processes train
// examples/mlp.yaml (1M parameters, 5 units), the same MLP at 35M
// (bench/models/mlp35m.yaml) or the GPT of examples/gpt-7m.yaml,
// and rank 0 reports the median step split into compute, exposed communication
// (the compute stream waiting for the communication stream) and optimizer, for
// each backward-prefetch policy side by side in one run, so the overlap the
// prefetch buys shows as a ratio. Timings are device time (events).
//
//   train_step_bench [--worlds 2,4] [--steps 30] [--batch 64] [--model mlp|mlp35m|gpt]
//                    [--device cpu|sim|cuda] [--comm auto|gloo|nccl] [--gpus 0,1,...]
//                    [--param-dtype bfloat16] [--reduce-dtype bfloat16]
//                    [--same-host-copies on|off|both] [--forward-prefetch off|on|both]
//                    (--help)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <utility>
#include <vector>

#include <unistd.h>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"

#include "bench/bench_flags.h"
#include "bench/forked_ranks.h"
#include "core/model_spec_yaml.h"
#include "storage/spec_files.h"
#include "worker/comm/file_store.h"
#include "worker/device/device_factory.h"
#include "worker/runtime/local_trainer.h"

namespace flatshard {
namespace {

struct Row {
  double step = 0, compute = 0, comm = 0, optim = 0;
};

// Every (same-host copies, forward prefetch) pair to run, back to back.
std::vector<std::pair<bool, bool>> Runs(const std::vector<bool>& copies,
                                        const std::vector<bool>& forward) {
  std::vector<std::pair<bool, bool>> runs;
  for (const bool c : copies) {
    for (const bool f : forward) runs.emplace_back(c, f);
  }
  return runs;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int RunRank(LocalTrainOptions options, const DeviceOptions& device_options,
            const std::vector<int>& gpus, const std::string& dir, int rank, int world,
            const std::string& out) {
  auto store = FileStore::Open(dir);
  if (!store.ok()) return 1;
  DeviceOptions device = device_options;
  device.gpu = gpus.empty() ? rank : gpus[static_cast<size_t>(rank) % gpus.size()];
  device.sim.seed = static_cast<uint64_t>(rank) + 1;
  auto created = CreateDevice(device);
  if (!created.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, std::string(created.status().message()).c_str());
    return 2;
  }
  options.runtime.device = *std::move(created);
  auto result = TrainLocalRank(options, rank, world, *store);
  if (!result.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, std::string(result.status().message()).c_str());
    return 1;
  }
  if (rank != 0) return 0;
  std::vector<double> step, compute, comm, optim;
  // The first steps warm caches and connections; keep the rest.
  for (size_t i = 3; i < result->steps.size(); ++i) {
    const StepStats& s = result->steps[i].stats;
    compute.push_back(s.compute_seconds);
    comm.push_back(s.exposed_comm_seconds);
    optim.push_back(s.optimizer_seconds);
    step.push_back(s.compute_seconds + s.exposed_comm_seconds + s.optimizer_seconds);
  }
  std::ofstream(out) << Median(step) << " " << Median(compute) << " " << Median(comm) << " "
                     << Median(optim) << " " << (result->same_host_collectives ? 1 : 0) << "\n";
  return 0;
}

}  // namespace
}  // namespace flatshard

static int Main(int argc, char** argv) {
  using flatshard::BackwardPrefetch;
  using flatshard::LoadModelSpecFile;
  using flatshard::LocalTrainOptions;
  using flatshard::OptimizerKind;
  using flatshard::ParseWrapPolicy;
  using flatshard::RunRank;
  using flatshard::Runs;
  // One GEMM thread per rank, as flatshard-train-local and `flatshard up` on
  // a host with no more cores than ranks give them: more would spin on the
  // cores the other ranks compute on.
  setenv("OPENBLAS_NUM_THREADS", "1", /*overwrite=*/0);
  std::vector<int> worlds = {2, 4};
  int steps = 30;
  int64_t batch = 64;
  std::string model = "mlp";
  std::string device_name = "cpu";
  std::string comm_name = "auto";
  std::vector<int> gpus;
  CLI::App app{
      "train_step_bench: rank 0's median step split into compute, exposed communication and "
      "optimizer, for each backward-prefetch policy, in W worker processes"};
  app.add_option("--worlds", worlds, "Process counts")
      ->delimiter(',')
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--steps", steps, "Steps per run (the median skips the first 3)")
      ->check(CLI::Range(4, 1000000))
      ->capture_default_str();
  app.add_option("--batch", batch, "Global batch (samples per step, all ranks)")
      ->check(flatshard::bench::AtLeastOne())
      ->capture_default_str();
  app.add_option("--model", model,
                 "mlp (examples/mlp.yaml) | mlp35m (bench/models/mlp35m.yaml) | gpt "
                 "(examples/gpt-7m.yaml)")
      ->check(CLI::IsMember({"mlp", "mlp35m", "gpt"}))
      ->capture_default_str();
  app.add_option("--device", device_name, "cpu | sim | cuda")
      ->check(flatshard::bench::ParsedBy(flatshard::ParseDeviceKind, "DEVICE"))
      ->capture_default_str();
  app.add_option("--comm", comm_name, "auto (nccl on cuda, gloo otherwise) | gloo | nccl")
      ->check(flatshard::bench::ParsedBy(flatshard::ParseCommBackend, "COMM"))
      ->capture_default_str();
  std::string param_dtype, reduce_dtype;
  app.add_option("--param-dtype", param_dtype,
                 "Mixed precision: the all-gather and compute dtype (bfloat16, float16; "
                 "default: off)")
      ->check(flatshard::bench::ParsedBy(flatshard::ParseDType, "DTYPE"));
  app.add_option("--reduce-dtype", reduce_dtype,
                 "Mixed precision: the gradient reduction dtype (default: the param dtype)")
      ->check(flatshard::bench::ParsedBy(flatshard::ParseDType, "DTYPE"));
  app.add_option("--gpus", gpus, "The GPU of each rank (default: rank)")
      ->delimiter(',')
      ->check(flatshard::bench::AtLeastZero());
  std::string host_copies = "on";
  app.add_option("--same-host-copies", host_copies,
                 "Host collectives between ranks of this host: on (read each other's buffers, "
                 "SameHostCommunicator), off (Gloo over loopback TCP), or both, interleaved")
      ->check(CLI::IsMember({"on", "off", "both"}))
      ->capture_default_str();
  std::string forward_prefetch = "off";
  app.add_option("--forward-prefetch", forward_prefetch,
                 "FSDP's forward_prefetch: off, on (the next unit's all-gather is issued as "
                 "this unit's forward starts), or both, interleaved")
      ->check(CLI::IsMember({"on", "off", "both"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  std::vector<bool> forward_runs;
  if (forward_prefetch != "off") forward_runs.push_back(true);
  if (forward_prefetch != "on") forward_runs.push_back(false);
  std::vector<bool> copies_runs;
  if (host_copies != "off") copies_runs.push_back(true);
  if (host_copies != "on") copies_runs.push_back(false);
  auto dtype = [](const std::string& name) -> std::optional<flatshard::DType> {
    if (name.empty()) return std::nullopt;
    return *flatshard::ParseDType(name);
  };
  const std::optional<flatshard::DType> dtypes[2] = {dtype(param_dtype), dtype(reduce_dtype)};
  flatshard::DeviceOptions device;
  device.kind = *flatshard::ParseDeviceKind(device_name);
  const flatshard::CommBackend comm = *flatshard::ParseCommBackend(comm_name);
  const bool gpt = model == "gpt";
  const std::string file = gpt                 ? "/examples/gpt-7m.yaml"
                           : model == "mlp35m" ? "/bench/models/mlp35m.yaml"
                                               : "/examples/mlp.yaml";
  auto spec = LoadModelSpecFile(std::string(FLATSHARD_SOURCE_DIR) + file);
  if (!spec.ok()) return 1;
  std::printf(
      "| W | backward prefetch | forward prefetch | host copies | step | compute | exposed comm | "
      "optimizer | exposed comm / step |\n|---|---|---|---|---|---|---|---|---|\n");
  for (int world : worlds) {
    for (auto [name, prefetch] :
         {std::pair{"PRE", BackwardPrefetch::kPre}, std::pair{"POST", BackwardPrefetch::kPost},
          std::pair{"NONE", BackwardPrefetch::kNone}}) {
      for (const auto [same_host, forward] : Runs(copies_runs, forward_runs)) {
        LocalTrainOptions options;
        options.runtime.sharding.forward_prefetch = forward;
        options.runtime.gloo.same_host.enabled = same_host;
        options.spec = *spec;
        options.policy =
            *ParseWrapPolicy(gpt ? "module-type:TransformerBlock" : "module-type:Residual");
        options.runtime.sharding.backward_prefetch = prefetch;
        options.runtime.sharding.param_dtype = dtypes[0];
        options.runtime.sharding.reduce_dtype = dtypes[1];
        options.runtime.optimizer.kind = OptimizerKind::kAdamW;
        options.runtime.comm = comm;
        options.data.global_batch_size = batch;
        if (gpt) {
          options.data.kind = flatshard::compute::DataKind::kTokens;
          options.data.seq_len = 64;
          options.data.vocab_size = 4096;
        } else {
          options.data.kind = flatshard::compute::DataKind::kRegression;
          options.data.input_features = 64;
          options.data.output_features = 16;
        }
        options.steps = steps;
        options.summon_final_params = false;
        const std::string dir = absl::StrCat(std::filesystem::temp_directory_path().string(),
                                             "/flatshard-step-bench-", getpid(), "-", world, name);
        const std::string out = dir + ".out";
        const bool ok = flatshard::bench::RunForkedRanks(
            world, [&](int rank) { return RunRank(options, device, gpus, dir, rank, world, out); });
        double t[4] = {};
        int took_same_host = 0;
        std::ifstream in(out);
        if (!ok || !(in >> t[0] >> t[1] >> t[2] >> t[3] >> took_same_host)) return 1;
        // What the ranks took, not what was asked: a single rank, GPU ranks and
        // ranks that cannot read each other's memory keep their transport.
        const char* copies = took_same_host != 0 ? "same-host" : same_host ? "not taken" : "off";
        std::printf("| %d | %s | %s | %s | %.1f ms | %.1f ms | %.1f ms | %.1f ms | %.2f |\n", world,
                    name, forward ? "on" : "off", copies, t[0] * 1e3, t[1] * 1e3, t[2] * 1e3,
                    t[3] * 1e3, t[2] / t[0]);
        std::fflush(stdout);
        std::filesystem::remove_all(dir);
        std::filesystem::remove(out);
      }
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  return flatshard::bench::RunMain("train_step_bench", [&] { return Main(argc, argv); });
}
