// Checkpoint save and load throughput against the disk, and the training
// stall of async save against sync save (issue #5).
//
// 1. The disk, in the same run: sequential write of --disk-mib in 4 MiB
//    appends + fsync through the checkpoint writers' file interface, then a
//    warm and a cold (pages evicted) sequential read.
// 2. A real local cluster (coordinator + W worker daemons) training a
//    ~34M-parameter MLP (AdamW: ~400 MB of model and optimizer state). For each
//    state-dict type: synchronous save (files written, fsynced, committed) and
//    load (staged on every rank, then applied) twice, from the page cache and
//    from the disk (the checkpoint's pages evicted first), in MB/s of
//    checkpoint bytes and as a ratio to the disk figures of step 1.
// 3. Stall: how long training cannot run while a checkpoint is taken. Sync:
//    the whole save. Async: until the snapshot is taken (the first progress
//    message); its copies, the write and the commit then overlap training,
//    so one step is trained right then and its time shown beside a plain
//    step's.
//
//   checkpoint_bench [--workers 4] [--reps 3] [--disk-mib 1024] [--dir /tmp]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

#include "bench/bench_flags.h"
#include "client/flatshard_client.h"
#include "client/local_cluster.h"
#include "core/job_spec_yaml.h"
#include "storage/checkpoint_manifest.h"
#include "storage/file_system.h"
#include "storage/spec_files.h"

namespace flatshard {
namespace {

namespace fs = std::filesystem;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Seconds(absl::Time since) { return absl::ToDoubleSeconds(absl::Now() - since); }

// Drops `path`'s pages from the page cache (they are clean: written and
// fsynced), so the next read of it comes from the disk. No root needed,
// unlike /proc/sys/vm/drop_caches.
void Evict(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void EvictTree(const std::string& dir) {
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) Evict(entry.path().string());
  }
}

double ReadAll(const std::string& path, std::vector<char>& block) {
  const absl::Time start = absl::Now();
  const int fd = ::open(path.c_str(), O_RDONLY);
  while (::read(fd, block.data(), block.size()) > 0) {
  }
  ::close(fd);
  return Seconds(start);
}

struct DiskFigures {
  double write = 0, warm_read = 0, cold_read = 0;  // GB/s
};

// Sequential write (4 MiB appends, fsync at the end) through the file
// interface the checkpoint writers use (FileSystem::Default(), which starts
// writeback as it goes), then a warm read and a cold read (the pages evicted
// first) of the same file.
DiskFigures DiskBandwidth(const std::string& dir, int mib) {
  const std::string path = dir + "/disk-probe";
  fs::remove(path);
  std::vector<char> block(4 << 20, 'x');
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<WritableFile>> file = FileSystem::Default()->NewWritableFile(path);
  if (!file.ok()) std::abort();
  for (int i = 0; i < mib / 4; ++i) {
    if (!(*file)->Append(absl::string_view(block.data(), block.size())).ok()) std::abort();
  }
  if (!(*file)->Sync().ok() || !(*file)->Close().ok()) std::abort();
  const double write_s = Seconds(start);
  const double warm_s = ReadAll(path, block);
  Evict(path);
  const double cold_s = ReadAll(path, block);
  fs::remove(path);
  const double bytes = static_cast<double>(mib) * (1 << 20);
  return {bytes / write_s / 1e9, bytes / warm_s / 1e9, bytes / cold_s / 1e9};
}

std::string WriteJob(const std::string& dir, int workers) {
  std::ofstream(dir + "/bench-mlp.yaml") << R"(name: bench-mlp
dtype: float32
root:
  type: Sequential
  children:
    - {name: input, type: Linear, in_features: 64, out_features: 1024}
    - name: blocks
      type: ModuleList
      repeat: 4
      template:
        type: Residual
        children:
          - {name: fc1, type: Linear, in_features: 1024, out_features: 4096}
          - {name: act, type: GELU}
          - {name: fc2, type: Linear, in_features: 4096, out_features: 1024}
    - {name: norm, type: LayerNorm, normalized_shape: 1024}
    - {name: output, type: Linear, in_features: 1024, out_features: 16}
)";
  std::ofstream(dir + "/bench-job.yaml") << absl::StrFormat(R"(name: ckpt-bench
model: bench-mlp.yaml
wrap_policy: module-type:Residual
world_size: %d
sharding: {strategy: FULL_SHARD}
optimizer: {kind: adamw, lr: 0.001}
data: {kind: regression, global_batch_size: %d, seed: 1}
)",
                                                            workers, 8 * workers);
  return dir + "/bench-job.yaml";
}

int Run(int workers, int reps, int disk_mib, const std::string& base) {
  const std::string dir = base + "/flatshard-ckpt-bench";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<double> disk_w, disk_r, disk_c;
  for (int i = 0; i < reps; ++i) {
    const DiskFigures d = DiskBandwidth(dir, disk_mib);
    disk_w.push_back(d.write);
    disk_r.push_back(d.warm_read);
    disk_c.push_back(d.cold_read);
  }
  const double disk_write = Median(disk_w), disk_read = Median(disk_r), disk_cold = Median(disk_c);
  std::printf(
      "disk: sequential write + fsync %.2f GB/s, read warm %.2f GB/s, cold %.2f GB/s "
      "(%d MiB, median of %d)\n",
      disk_write, disk_read, disk_cold, disk_mib, reps);

  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecFile(WriteJob(dir, workers));
  if (!spec.ok()) {
    std::fprintf(stderr, "%s\n", std::string(spec.status().message()).c_str());
    return 1;
  }
  LocalClusterOptions options;
  options.workers = workers;
  options.bin_dir = fs::read_symlink("/proc/self/exe").parent_path().string();
  options.checkpoint_dir = dir + "/ckpt";
  auto cluster = LocalCluster::Start(options);
  if (!cluster.ok()) {
    std::fprintf(stderr, "%s\n", std::string(cluster.status().message()).c_str());
    return 1;
  }
  FlatshardClient client((*cluster)->address());
  if (!client.CreateJob(*spec).ok() ||
      !client.WaitForState("ckpt-bench", {v1::READY}, absl::Seconds(300)).ok()) {
    std::fprintf(stderr, "job did not become READY\n");
    return 1;
  }
  std::vector<double> step_s;
  absl::Status trained = client.Train(
      "ckpt-bench", 4, 0, [&](const v1::StepResult& r) { step_s.push_back(r.step_seconds()); });
  if (!trained.ok()) return 1;
  std::printf("training step (W=%d, %s): median %.0f ms\n", workers, "34M params, AdamW",
              Median(step_s) * 1e3);

  std::printf(
      "\n| type | bytes | save | save MB/s | save / disk write | load (warm) | load (cold) | "
      "load MB/s (cold) | cold load / cold read |\n|---|---|---|---|---|---|---|---|---|\n");
  int n = 0;
  for (v1::StateDictType type :
       {v1::FULL_STATE_DICT, v1::SHARDED_STATE_DICT, v1::LOCAL_STATE_DICT}) {
    std::vector<double> save_s, load_s, cold_s;
    int64_t bytes = 0;
    for (int i = 0; i < reps; ++i) {
      v1::SaveCheckpointRequest request;
      request.set_job("ckpt-bench");
      request.set_name(absl::StrCat("c", n++));
      request.mutable_settings()->set_state_dict_type(type);
      absl::Time start = absl::Now();
      absl::StatusOr<v1::CheckpointProgress> saved = client.SaveCheckpoint(request);
      save_s.push_back(Seconds(start));
      if (!saved.ok()) {
        std::fprintf(stderr, "save: %s\n", std::string(saved.status().message()).c_str());
        return 1;
      }
      bytes = saved->bytes_written();
      start = absl::Now();
      absl::StatusOr<v1::CheckpointProgress> loaded =
          client.LoadCheckpoint("ckpt-bench", saved->name());
      load_s.push_back(Seconds(start));
      if (!loaded.ok()) return 1;
      // The same load from the disk: the checkpoint's pages evicted first.
      EvictTree(absl::StrCat(options.checkpoint_dir, "/ckpt-bench/", saved->name()));
      start = absl::Now();
      loaded = client.LoadCheckpoint("ckpt-bench", saved->name());
      cold_s.push_back(Seconds(start));
      if (!loaded.ok()) return 1;
      (void)client.DeleteCheckpoint("ckpt-bench", saved->name());
    }
    const double mb = static_cast<double>(bytes) / 1e6;
    const double save = Median(save_s), load = Median(load_s), cold = Median(cold_s);
    std::printf("| %s | %.0f MB | %.3f s | %.0f | %.2f | %.3f s | %.3f s | %.0f | %.2f |\n",
                std::string(StateDictTypeName(type)).c_str(), mb, save, mb / save,
                mb / save / (disk_write * 1e3), load, cold, mb / cold,
                mb / cold / (disk_cold * 1e3));
  }

  // An async save's snapshot copies overlap the next step's forward and
  // backward (its update waits for them), so the stall alone would not show
  // what they cost: one step is trained as soon as the save reports its
  // snapshot, and its step time is reported beside the plain step's.
  std::printf(
      "\n| save | training stall (median) | time to commit (median) | stall async / sync | "
      "step right after (median) | plain step |\n|---|---|---|---|---|---|\n");
  for (v1::StateDictType type : {v1::SHARDED_STATE_DICT, v1::LOCAL_STATE_DICT}) {
    double sync_stall = 0;
    for (bool async_save : {false, true}) {
      std::vector<double> stall_s, commit_s, next_step_s;
      for (int i = 0; i < reps; ++i) {
        v1::SaveCheckpointRequest request;
        request.set_job("ckpt-bench");
        request.set_name(absl::StrCat("s", n++));
        request.set_async_save(async_save);
        request.mutable_settings()->set_state_dict_type(type);
        const absl::Time start = absl::Now();
        double stall = -1;
        std::thread next_step;
        absl::Status trained_next = absl::OkStatus();
        absl::StatusOr<v1::CheckpointProgress> saved =
            client.SaveCheckpoint(request, [&](const v1::CheckpointProgress& p) {
              if (p.done() || stall >= 0) return;
              stall = Seconds(start);
              if (!async_save) return;
              next_step = std::thread([&] {
                trained_next = client.Train("ckpt-bench", 1, 0, [&](const v1::StepResult& r) {
                  next_step_s.push_back(r.step_seconds());
                });
              });
            });
        if (next_step.joinable()) next_step.join();
        commit_s.push_back(Seconds(start));
        if (!saved.ok() || !trained_next.ok()) {
          std::fprintf(stderr, "async save + step: %s / %s\n",
                       std::string(saved.status().message()).c_str(),
                       std::string(trained_next.message()).c_str());
          return 1;
        }
        stall_s.push_back(async_save ? stall : commit_s.back());
        (void)client.DeleteCheckpoint("ckpt-bench", saved->name());
      }
      if (!async_save) sync_stall = Median(stall_s);
      std::printf(
          "| %s %s | %.3f s | %.3f s | %.2f | %s | %.0f ms |\n",
          std::string(StateDictTypeName(type)).c_str(), async_save ? "async" : "sync",
          Median(stall_s), Median(commit_s), Median(stall_s) / sync_stall,
          next_step_s.empty() ? "-" : absl::StrFormat("%.0f ms", Median(next_step_s) * 1e3).c_str(),
          Median(step_s) * 1e3);
    }
  }
  const bool clean = (*cluster)->Stop();
  fs::remove_all(dir);
  return clean ? 0 : 1;
}

}  // namespace
}  // namespace flatshard

static int Main(int argc, char** argv) {
  int workers = 4, reps = 3, disk_mib = 1024;
  std::string dir = "/tmp";
  CLI::App app{
      "checkpoint_bench: FULL, SHARDED and LOCAL saves and loads (sync and async) of a real "
      "cluster, each against the disk's own sequential write and cold read in the same run"};
  app.add_option("--workers", workers, "Worker processes (the world size)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--reps", reps, "Repetitions of each measurement (medians)")
      ->check(flatshard::bench::AtLeastOne())
      ->capture_default_str();
  app.add_option("--disk-mib", disk_mib, "MiB the disk ceilings write and read")
      ->check(flatshard::bench::AtLeastOne())
      ->capture_default_str();
  app.add_option("--dir", dir, "Where checkpoints and the disk probes are written")
      ->check(CLI::ExistingDirectory)
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  return flatshard::Run(workers, reps, disk_mib, dir);
}

int main(int argc, char** argv) {
  return flatshard::bench::RunMain("checkpoint_bench", [&] { return Main(argc, argv); });
}
