// What the checkpoint tests share (checkpoint_test.cc, checkpoint_faults_test.cc):
// the example job at a world size, a local cluster of real daemons with it
// READY, training and saving through the client, and reading the files back.
#ifndef FLATSHARD_TESTS_INTEGRATION_CHECKPOINT_HARNESS_H_
#define FLATSHARD_TESTS_INTEGRATION_CHECKPOINT_HARNESS_H_

#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

#include "client/flatshard_client.h"
#include "client/local_cluster.h"
#include "core/job_spec_yaml.h"
#include "storage/checkpoint_reader.h"
#include "storage/durable_file.h"
#include "storage/safetensors_reader.h"
#include "storage/spec_files.h"

namespace flatshard::checkpoint_testing {

inline const std::string kJobFile = std::string(FLATSHARD_SOURCE_DIR) + "/examples/mlp-job.yaml";
inline constexpr char kJob[] = "mlp-demo";

// The example job at `world` ranks; a batch every world size here divides.
inline v1::JobSpec Spec(int world, bool fp32) {
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecFile(kJobFile);
  EXPECT_TRUE(spec.ok()) << spec.status();
  spec->set_world_size(world);
  spec->mutable_data()->set_global_batch_size(48);
  spec->mutable_checkpoints()->set_keep_last(0);
  if (fp32) spec->mutable_sharding()->clear_mixed_precision();
  return *spec;
}

struct Cluster {
  std::unique_ptr<LocalCluster> processes;
  std::unique_ptr<FlatshardClient> client;

  ~Cluster() {
    if (processes != nullptr) {
      EXPECT_TRUE(processes->Stop()) << "a daemon did not stop cleanly";
    }
  }
};

// Where the daemons and the CLI are: FLATSHARD_BIN_DIR in the environment (a
// prebuilt bundle on a GPU machine, scripts/gpu-check.sh), else the build's.
inline std::string BinDir() {
  const char* bin_dir = std::getenv("FLATSHARD_BIN_DIR");
  return bin_dir != nullptr ? bin_dir : FLATSHARD_BIN_DIR;
}

// `device`: the workers' --device (the sim instances carry the ctest label sim;
// cuda puts every worker on GPU 0, talking Gloo).
inline std::unique_ptr<Cluster> Start(const v1::JobSpec& spec, const std::string& root,
                                      const std::string& device = "cpu",
                                      std::map<int, std::vector<std::string>> worker_flags = {}) {
  LocalClusterOptions options;
  options.worker_flags = std::move(worker_flags);
  options.workers = spec.world_size();
  options.device = device;
  if (device == "cuda") {
    options.comm = "gloo";
    options.gpus = {0};
  }
  options.bin_dir = BinDir();
  options.checkpoint_dir = root;
  auto cluster = std::make_unique<Cluster>();
  absl::StatusOr<std::unique_ptr<LocalCluster>> started = LocalCluster::Start(options);
  EXPECT_TRUE(started.ok()) << started.status();
  if (!started.ok()) return nullptr;
  cluster->processes = *std::move(started);
  cluster->client = std::make_unique<FlatshardClient>(cluster->processes->address());
  EXPECT_TRUE(cluster->client->CreateJob(spec).ok());
  absl::StatusOr<v1::JobState> ready =
      cluster->client->WaitForState(spec.name(), {v1::READY}, absl::Seconds(120));
  EXPECT_TRUE(ready.ok()) << ready.status();
  return cluster;
}

inline std::vector<v1::StepResult> Train(FlatshardClient& client, int64_t steps) {
  std::vector<v1::StepResult> results;
  absl::Status status =
      client.Train(kJob, steps, 0, [&](const v1::StepResult& r) { results.push_back(r); });
  EXPECT_TRUE(status.ok()) << status;
  return results;
}

inline absl::StatusOr<v1::CheckpointProgress> Save(FlatshardClient& client, const std::string& name,
                                                   v1::StateDictType type, bool async_save = false,
                                                   int* progress_messages = nullptr) {
  v1::SaveCheckpointRequest request;
  request.set_job(kJob);
  request.set_name(name);
  request.set_async_save(async_save);
  request.mutable_settings()->set_state_dict_type(type);
  return client.SaveCheckpoint(request, [&](const v1::CheckpointProgress&) {
    if (progress_messages != nullptr) ++*progress_messages;
  });
}

inline std::map<std::string, SafetensorsTensor> ReadTensors(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadFileToString(path);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  if (!bytes.ok()) return {};
  auto tensors = ParseSafetensors(*bytes, nullptr, path);
  EXPECT_TRUE(tensors.ok()) << tensors.status();
  return tensors.ok() ? *tensors : std::map<std::string, SafetensorsTensor>{};
}

// Tensor by tensor, bytes compared: bit-identical or a message naming the first
// tensor that differs.
inline void ExpectSameTensors(const std::string& a, const std::string& b) {
  const auto ta = ReadTensors(a), tb = ReadTensors(b);
  ASSERT_FALSE(ta.empty());
  ASSERT_EQ(ta.size(), tb.size()) << a << " vs " << b;
  for (const auto& [name, tensor] : ta) {
    ASSERT_TRUE(tb.contains(name)) << name << " missing from " << b;
    EXPECT_EQ(tensor.shape, tb.at(name).shape) << name;
    EXPECT_TRUE(tensor.data == tb.at(name).data)
        << name << " differs between " << a << " and " << b;
  }
}

inline std::string Dir(const std::string& root, const std::string& name) {
  return absl::StrCat(root, "/", kJob, "/", name);
}

// The job goes on after a fault: it trains a step, and a save named "after"
// (of `type`, in the background if `async_save`) commits whole under `root`.
inline void ExpectTheJobTrainsAndSavesOn(FlatshardClient& client, const std::string& root,
                                         v1::StateDictType type, bool async_save = false) {
  Train(client, 1);
  ASSERT_TRUE(Save(client, "after", type, async_save).ok());
  absl::StatusOr<std::unique_ptr<CheckpointReader>> after =
      CheckpointReader::Open(Dir(root, "after"));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE((*after)->VerifyAll().ok());
}

// docs/fsdp-semantics.md §5.3–5.4, §6.3–6.4.
// Every checkpoint test runs on CPU workers and on simulated-GPU workers, whose
// shards live in device memory and are staged through pinned host buffers.
}  // namespace flatshard::checkpoint_testing

#endif  // FLATSHARD_TESTS_INTEGRATION_CHECKPOINT_HARNESS_H_
