// flatshard-train-local: an FSDP job of W worker processes on this machine
// without a coordinator. Rendezvous through a FileStore in a temporary directory;
// the launcher forks W ranks of itself and prints rank 0's progress. The data
// plane's standalone mode: the coordinator and `flatshard up` drive the same
// runtime for real clusters.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <vector>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "rpc/mutex_deadlock_detection.h"

#include "core/model_spec_yaml.h"
#include "storage/spec_files.h"
#include "worker/comm/file_store.h"
#include "worker/compute/model.h"
#include "worker/device/device_factory.h"
#include "worker/runtime/local_trainer.h"
#include "worker/runtime/runtime_groups.h"

namespace flatshard {
namespace {

struct Flags {
  std::string model;
  std::string policy = "none";
  int world_size = 2;
  std::string strategy = "FULL_SHARD";
  int hybrid_shard_size = 0;
  bool use_orig_params = false;
  std::string param_dtype;
  std::string reduce_dtype;
  std::string backward_prefetch = "pre";
  bool forward_prefetch = false;
  bool no_limit_all_gathers = false;
  std::string optimizer = "adamw";
  double lr = 1e-3;
  double weight_decay = 0.0;
  double max_grad_norm = 0.0;
  int64_t steps = 20;
  int no_sync = 0;
  std::string data = "auto";
  int64_t batch = 32;
  int64_t seq_len = 32;
  uint64_t seed = 0;
  std::string device = "cpu";
  std::vector<int> gpus;  // cuda: rank r on gpus[r % size]; empty: GPU r
  std::string comm = "auto";
  int rank = -1;  // internal: set by the launcher
  std::string store;
};

absl::StatusOr<LocalTrainOptions> BuildOptions(const Flags& f) {
  LocalTrainOptions o;
  absl::StatusOr<ModelSpec> spec = LoadModelSpecFile(f.model);
  if (!spec.ok()) return spec.status();
  o.spec = *spec;
  absl::StatusOr<WrapPolicy> policy = ParseWrapPolicy(f.policy);
  if (!policy.ok()) return policy.status();
  o.policy = *policy;
  // The same two settings structs a job file fills (core/job_config.h).
  ShardingSettings& sharding = o.runtime.sharding;
  absl::StatusOr<ShardingStrategy> strategy = ParseShardingStrategy(f.strategy);
  if (!strategy.ok()) return strategy.status();
  sharding.strategy = *strategy;
  sharding.hybrid_shard_group_size = f.hybrid_shard_size;
  sharding.use_orig_params = f.use_orig_params;
  for (const auto& [flag, text, target] :
       {std::tuple{"--param-dtype", &f.param_dtype, &sharding.param_dtype},
        std::tuple{"--reduce-dtype", &f.reduce_dtype, &sharding.reduce_dtype}}) {
    if (text->empty()) continue;
    absl::StatusOr<DType> dtype = ParseDType(*text);
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": ", dtype.status().message()));
    }
    *target = *dtype;
  }
  if (f.backward_prefetch == "pre") {
    sharding.backward_prefetch = BackwardPrefetch::kPre;
  } else if (f.backward_prefetch == "post") {
    sharding.backward_prefetch = BackwardPrefetch::kPost;
  } else if (f.backward_prefetch == "none") {
    sharding.backward_prefetch = BackwardPrefetch::kNone;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--backward-prefetch must be pre, post or none, got '", f.backward_prefetch, "'"));
  }
  sharding.forward_prefetch = f.forward_prefetch;
  sharding.limit_all_gathers = !f.no_limit_all_gathers;
  OptimizerSettings& optimizer = o.runtime.optimizer;
  absl::StatusOr<OptimizerKind> optimizer_kind = ParseOptimizerKind(f.optimizer);
  if (!optimizer_kind.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--optimizer must be sgd, adam or adamw, got '", f.optimizer, "'"));
  }
  optimizer.kind = *optimizer_kind;
  if (optimizer.kind == OptimizerKind::kSgd) {
    optimizer.sgd = SgdOptions{f.lr, 0.9, 0.0, false, f.weight_decay};
  } else {
    optimizer.adam.lr = f.lr;
    optimizer.adam.weight_decay = f.weight_decay;
  }
  optimizer.max_grad_norm = f.max_grad_norm;
  o.runtime.seed = f.seed;
  absl::StatusOr<DeviceKind> device = ParseDeviceKind(f.device);
  if (!device.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--device: ", device.status().message()));
  }
  absl::StatusOr<CommBackend> comm = ParseCommBackend(f.comm);
  if (!comm.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--comm: ", comm.status().message()));
  }
  if (absl::Status resolved = ResolveCommBackend(*comm, *device).status(); !resolved.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--comm: ", resolved.message()));
  }
  o.runtime.comm = *comm;
  o.steps = f.steps;
  o.no_sync_micro_steps = f.no_sync;
  o.summon_final_params = false;

  // The data set follows the model: token ids for models that embed tokens,
  // teacher-student regression with the model's widths otherwise.
  absl::StatusOr<ModelIndex> index = IndexModel(o.spec);
  if (!index.ok()) return index.status();
  absl::StatusOr<std::unique_ptr<compute::Model>> model =
      compute::Model::Create(o.spec, *index, compute::LossKind::kMse);
  if (!model.ok()) return model.status();
  std::string kind = f.data;
  if (kind == "auto") kind = (*model)->takes_token_ids() ? "tokens" : "regression";
  absl::StatusOr<compute::DataKind> data_kind = compute::ParseDataKind(kind);
  if (!data_kind.ok()) return data_kind.status();
  o.data.kind = *data_kind;
  o.data.global_batch_size = f.batch;
  o.data.seq_len = (*model)->takes_token_ids() ? f.seq_len : 1;
  o.data.seed = f.seed + 1;
  o.data.input_features = (*model)->input_features();
  o.data.output_features = (*model)->output_features();
  o.data.vocab_size = (*model)->vocab_size();
  if (f.batch % f.world_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--batch ", f.batch, " must be divisible by --world-size ", f.world_size));
  }
  return o;
}

int RunRank(const Flags& f) {
  absl::StatusOr<LocalTrainOptions> options = BuildOptions(f);
  if (!options.ok()) {
    std::cerr << "flatshard-train-local: " << options.status().message() << "\n";
    return 2;
  }
  // Each rank makes its own device, in its own process.
  DeviceOptions device;
  device.kind = *ParseDeviceKind(f.device);
  device.gpu = f.gpus.empty() ? f.rank : f.gpus[static_cast<size_t>(f.rank) % f.gpus.size()];
  device.sim.seed = static_cast<uint64_t>(f.rank) + 1;
  absl::StatusOr<std::shared_ptr<Device>> created = CreateDevice(device);
  if (!created.ok()) {
    std::cerr << "flatshard-train-local: rank " << f.rank << ": --device " << f.device << ": "
              << created.status().message() << "\n";
    return 2;
  }
  options->runtime.device = *std::move(created);
  auto store = FileStore::Open(f.store);
  if (!store.ok()) {
    std::cerr << "rank " << f.rank << ": " << store.status() << "\n";
    return 1;
  }
  const auto start = std::chrono::steady_clock::now();
  const int64_t samples_per_step = f.batch * (f.no_sync + 1);
  auto result =
      TrainLocalRank(*options, f.rank, f.world_size, *store, [&](const LocalStepRecord& r) {
        if (f.rank != 0) return;
        const double elapsed =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const double per_step = elapsed / static_cast<double>(r.step + 1);
        std::printf(
            "step %4lld/%lld  loss %.5f  %.0f samples/s  compute %.1f ms  "
            "exposed comm %.1f ms  optim %.1f ms  ETA %.0fs\n",
            static_cast<long long>(r.step) + 1, static_cast<long long>(f.steps), r.loss,
            static_cast<double>(samples_per_step) / per_step, r.stats.compute_seconds * 1e3,
            r.stats.exposed_comm_seconds * 1e3, r.stats.optimizer_seconds * 1e3,
            per_step * static_cast<double>(f.steps - r.step - 1));
        std::fflush(stdout);
      });
  if (!result.ok()) {
    std::cerr << "rank " << f.rank << ": " << result.status() << "\n";
    return 1;
  }
  if (f.rank == 0) {
    std::printf("rank 0: first loss %.5f, last loss %.5f, peak unsharded %.2f MiB\n",
                result->steps.front().loss, result->steps.back().loss,
                static_cast<double>(result->peak_unsharded_bytes) / (1 << 20));
  }
  return 0;
}

std::vector<pid_t> children;

void StopChildren(int) {
  for (pid_t pid : children) kill(pid, SIGTERM);
}

int Launch(const Flags& f, int argc, char** argv) {
  // Validate once here so a bad flag fails before any process starts.
  if (absl::StatusOr<LocalTrainOptions> options = BuildOptions(f); !options.ok()) {
    std::cerr << "flatshard-train-local: " << options.status().message() << "\n";
    return 2;
  }
  const std::string store = f.store.empty()
                                ? absl::StrCat(std::filesystem::temp_directory_path().string(),
                                               "/flatshard-local-", getpid())
                                : f.store;
  std::filesystem::remove_all(store);
  // One BLAS thread per rank unless the user says otherwise: the ranks already
  // share the cores, and OpenBLAS's pool per process would oversubscribe them.
  setenv("OPENBLAS_NUM_THREADS", "1", /*overwrite=*/0);
  signal(SIGINT, StopChildren);
  signal(SIGTERM, StopChildren);
  for (int rank = 0; rank < f.world_size; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      std::vector<std::string> args(argv, argv + argc);
      args.push_back("--rank=" + std::to_string(rank));
      args.push_back("--store=" + store);
      std::vector<char*> cargs;
      cargs.reserve(args.size() + 1);
      for (std::string& a : args) cargs.push_back(a.data());
      cargs.push_back(nullptr);
      execv("/proc/self/exe", cargs.data());
      _exit(127);
    }
    children.push_back(pid);
  }
  int failed = 0;
  bool refused = true;  // every failure was a refusal (exit 2): say so with exit 2
  for (size_t rank = 0; rank < children.size(); ++rank) {
    int status = 0;
    waitpid(children[rank], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      refused = refused && WIFEXITED(status) && WEXITSTATUS(status) == 2;
      std::cerr << "flatshard-train-local: rank " << rank << " failed ("
                << (WIFSIGNALED(status) ? absl::StrCat("signal ", WTERMSIG(status))
                                        : absl::StrCat("exit ", WEXITSTATUS(status)))
                << ")\n";
      ++failed;
    }
  }
  std::filesystem::remove_all(store);
  if (failed == 0) return 0;
  return refused ? 2 : 1;
}

}  // namespace
}  // namespace flatshard

namespace {

int Main(int argc, char** argv) {
  flatshard::Flags f;
  CLI::App app{"flatshard-train-local: train a model with W FSDP worker processes on this machine"};
  app.add_option("--model,-m", f.model, "Model spec (YAML/JSON)")->required();
  app.add_option("--policy,-p", f.policy, "Wrap policy (see `flatshard plan --help`)")
      ->capture_default_str();
  app.add_option("--world-size,-w", f.world_size, "Worker processes")->capture_default_str();
  app.add_option("--strategy,-s", f.strategy, "Sharding strategy")->capture_default_str();
  app.add_option("--hybrid-shard-size", f.hybrid_shard_size, "Ranks per shard group (hybrid)");
  app.add_flag("--use-orig-params", f.use_orig_params, "use_orig_params layout");
  app.add_option("--param-dtype", f.param_dtype, "Mixed precision all-gather/compute dtype");
  app.add_option("--reduce-dtype", f.reduce_dtype, "Gradient reduction dtype");
  app.add_option("--backward-prefetch", f.backward_prefetch, "pre | post | none")
      ->capture_default_str();
  app.add_flag("--forward-prefetch", f.forward_prefetch, "Prefetch the next unit in forward");
  app.add_flag("--no-limit-all-gathers", f.no_limit_all_gathers, "Disable the rate limiter");
  app.add_option("--optimizer", f.optimizer, "sgd | adam | adamw")->capture_default_str();
  app.add_option("--lr", f.lr, "Learning rate")->capture_default_str();
  app.add_option("--weight-decay", f.weight_decay, "Weight decay")->capture_default_str();
  app.add_option("--max-grad-norm", f.max_grad_norm, "Clip gradients to this norm (0: off)");
  app.add_option("--steps", f.steps, "Optimizer steps")->capture_default_str();
  app.add_option("--no-sync", f.no_sync, "no_sync micro-steps before each synced step");
  app.add_option("--data", f.data, "auto | regression | classification | tokens")
      ->capture_default_str();
  app.add_option("--batch", f.batch, "Global batch size (samples per step)")->capture_default_str();
  app.add_option("--seq-len", f.seq_len, "Tokens per sample for token models")
      ->capture_default_str();
  app.add_option("--seed", f.seed, "Seed for parameters and data")->capture_default_str();
  app.add_option("--device", f.device,
                 "Device every rank computes on: cpu, cuda (rank r on GPU r) or sim (the strict "
                 "simulated GPU)")
      ->capture_default_str();
  app.add_option("--gpus", f.gpus,
                 "With --device cuda: GPUs for the ranks, rank r on the r-th (cycling; several "
                 "ranks per GPU need --comm gloo)")
      ->delimiter(',');
  app.add_option("--comm", f.comm,
                 "Collectives for device memory: auto (nccl on cuda, gloo otherwise), gloo or nccl")
      ->capture_default_str();
  app.add_option("--rank", f.rank)->group("");  // internal
  app.add_option("--store", f.store, "Rendezvous directory (default: a temporary one)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (f.world_size < 1) {
    std::cerr << "flatshard-train-local: --world-size must be >= 1\n";
    return 2;
  }
  return f.rank >= 0 ? flatshard::RunRank(f) : flatshard::Launch(f, argc, argv);
}

}  // namespace

int main(int argc, char** argv) {
  flatshard::TurnOffMutexDeadlockDetection();
  // CLI11 reports through exceptions; anything else escaping is a bug, but it
  // still ends with a message rather than std::terminate.
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "flatshard-train-local: " << e.what() << "\n";
    return 1;
  }
}
