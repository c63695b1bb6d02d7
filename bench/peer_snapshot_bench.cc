// The cost of in-memory peer snapshots (issue #11 §5): a job (by default
// examples/mlp-job.yaml, 4 ranks; the demo's GPT with --job
// examples/gpt-job.yaml --data-dir DIR, DIR holding gpt-text/ from
// `flatshard data prepare-text`) trained on a real local cluster with
// checkpoints.in_memory_every_steps 0 (off) and K, interleaved
// (off, K, off, K, ...: this machine is noisy), the median step time of each
// and their ratio; the host memory the snapshots take per worker (its
// flatshard_peer_snapshot_bytes gauge) against the shard and optimizer state
// they copy; and the time a recovery from memory takes against one from a
// checkpoint.
//
//   peer_snapshot_bench [--workers 4] [--every 1] [--steps 40] [--rounds 3]
//                       [--job examples/mlp-job.yaml] [--data-dir .]
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <curl/curl.h>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

#include "bench/bench_flags.h"
#include "bench/cluster_bench.h"
#include "client/flatshard_client.h"
#include "client/local_cluster.h"
#include "core/job_spec_yaml.h"
#include "storage/spec_files.h"

namespace flatshard {
namespace {

size_t Append(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

// The value of the first sample of `metric` on the /metrics page at `address`.
double Scrape(const std::string& address, const std::string& metric) {
  std::string body;
  CURL* curl = curl_easy_init();
  const std::string url = "http://" + address + "/metrics";
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &Append);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
  const bool ok = curl_easy_perform(curl) == CURLE_OK;
  curl_easy_cleanup(curl);
  if (!ok) return -1;
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    const bool labelled = metric.find('{') != std::string::npos;
    if (!absl::StartsWith(line, labelled ? metric : metric + "{")) continue;
    double value = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value)) return value;
  }
  return -1;
}

struct Flags {
  int workers = 4;
  int every = 1;
  int steps = 40;
  int rounds = 3;
  std::string job = std::string(FLATSHARD_SOURCE_DIR) + "/examples/mlp-job.yaml";
  std::string data_dir = ".";
};

// The flags on `app`; CLI11_PARSE in Main reports errors and --help.
void AddFlags(CLI::App& app, Flags& f) {
  app.add_option("--job", f.job, "Job spec (YAML)")
      ->check(CLI::ExistingFile)
      ->capture_default_str();
  app.add_option("--data-dir", f.data_dir, "Where the disk checkpoints are written")
      ->check(CLI::ExistingDirectory)
      ->capture_default_str();
  app.add_option("--workers", f.workers, "Worker processes")
      ->check(CLI::Range(2, 64))
      ->capture_default_str();
  app.add_option("--every", f.every, "Peer snapshot every N steps")
      ->check(flatshard::bench::AtLeastOne())
      ->capture_default_str();
  app.add_option("--steps", f.steps, "Steps per run")
      ->check(flatshard::bench::AtLeastOne())
      ->capture_default_str();
  app.add_option("--rounds", f.rounds, "Interleaved rounds (medians)")
      ->check(flatshard::bench::AtLeastOne())
      ->capture_default_str();
}

v1::JobSpec Job(const Flags& flags, int every, int64_t checkpoint_every) {
  auto spec = LoadJobSpecFile(flags.job);
  if (!spec.ok()) {
    std::fprintf(stderr, "%s\n", spec.status().ToString().c_str());
    std::exit(1);
  }
  spec->mutable_checkpoints()->set_in_memory_every_steps(every);
  spec->mutable_checkpoints()->set_every_steps(checkpoint_every);
  spec->mutable_state_dict_settings()->set_state_dict_type(v1::SHARDED_STATE_DICT);
  spec->mutable_recovery()->set_spare_wait_s(30);
  return *spec;
}

bool Create(FlatshardClient& client, const v1::JobSpec& spec) {
  if (!client.CreateJob(spec).ok()) return false;
  return client.WaitForState(spec.name(), {v1::READY}, absl::Seconds(120)).ok();
}

int WorkerOfRank(LocalCluster& cluster, FlatshardClient& client, const std::string& job, int rank) {
  auto workers = client.ListWorkers(job);
  if (!workers.ok()) return -1;
  for (const v1::WorkerInfo& w : *workers) {
    if (w.rank() != rank) continue;
    for (int i = 0; i < cluster.num_workers(); ++i) {
      if (cluster.worker_addresses()[static_cast<size_t>(i)] == w.address()) return i;
    }
  }
  return -1;
}

int Main(int argc, char** argv) {
  Flags flags;
  CLI::App app{
      "peer_snapshot_bench: the step-time cost of in-memory peer snapshots, and recovery from "
      "them against recovery from the last disk checkpoint, on a real local cluster"};
  AddFlags(app, flags);
  CLI11_PARSE(app, argc, argv);
  curl_global_init(CURL_GLOBAL_DEFAULT);
  LocalClusterOptions options;
  options.workers = flags.workers + 1;  // one spare for the recovery timings
  options.bin_dir = FLATSHARD_BIN_DIR;
  options.heartbeat_interval_s = 0.25;
  options.heartbeat_timeout_s = 2.0;
  char dir[] = "/tmp/peer-snapshot-bench.XXXXXX";
  if (::mkdtemp(dir) == nullptr) return 1;
  options.checkpoint_dir = dir;
  options.data_dir = flags.data_dir;
  auto cluster = LocalCluster::Start(options);
  if (!cluster.ok()) {
    std::fprintf(stderr, "%s\n", cluster.status().ToString().c_str());
    return 1;
  }
  FlatshardClient client((*cluster)->address());

  std::map<int, std::vector<double>> medians;  // by K
  double snapshot_bytes = 0, optimizer_bytes = 0, shard_bytes = 0;
  for (int round = 0; round < flags.rounds; ++round) {
    for (const int every : {0, flags.every}) {
      const v1::JobSpec spec = Job(flags, every, 0);
      if (!Create(client, spec)) return 1;
      const double median = Median(StepTimes(client, spec.name(), flags.steps));
      medians[every].push_back(median);
      std::printf("round %d  K=%d  median step %.2f ms\n", round, every, median * 1e3);
      if (every > 0) {
        const std::string rank0 = (*cluster)->worker_metrics()[static_cast<size_t>(
            WorkerOfRank(**cluster, client, spec.name(), 0))];
        snapshot_bytes = Scrape(rank0, "flatshard_peer_snapshot_bytes");
        const std::string memory = "flatshard_memory_bytes{job_name=\"" + spec.name() + "\",kind=";
        shard_bytes = Scrape(rank0, memory + "\"sharded_params\"");
        optimizer_bytes = Scrape(rank0, memory + "\"optimizer_state\"");
      }
      if (!client.DeleteJob(spec.name()).ok()) return 1;
    }
  }
  const double off = Median(medians[0]);
  const double on = Median(medians[flags.every]);
  std::printf("\nstep time, median of %d rounds: off %.2f ms, K=%d %.2f ms, ratio %.3f (%+.1f%%)\n",
              flags.rounds, off * 1e3, flags.every, on * 1e3, on / off, (on / off - 1) * 100);
  std::printf(
      "rank 0 holds %.2f MB of peer snapshots for %.2f MB of shard + optimizer state "
      "(%.1fx)\n",
      snapshot_bytes / 1e6, (shard_bytes + optimizer_bytes) / 1e6,
      snapshot_bytes / std::max(1.0, shard_bytes + optimizer_bytes));

  // Recovery from memory vs from a checkpoint: the same kill, the same spare.
  for (const bool memory : {true, false}) {
    const v1::JobSpec spec = Job(flags, memory ? flags.every : 0, memory ? 0 : 5);
    if (!Create(client, spec)) return 1;
    const int victim = WorkerOfRank(**cluster, client, spec.name(), 1);
    int seen = 0;
    v1::Recovery recovery;
    (void)client.Train(spec.name(), 12, 0, [&](const v1::StepResult& r) {
      if (r.has_recovery()) recovery = r.recovery();
      if (++seen == 8) (*cluster)->worker(victim).Signal(SIGKILL);
    });
    std::printf("recovery from %s: %.3f s from the failure to ready, %lld step(s) lost\n",
                memory ? "peer snapshots" : "checkpoint", recovery.seconds(),
                static_cast<long long>(recovery.steps_lost()));
    (void)client.DeleteJob(spec.name());
    if (!(*cluster)->RestartWorker(victim).ok()) return 1;
  }
  return 0;
}

}  // namespace
}  // namespace flatshard

int main(int argc, char** argv) {
  return flatshard::bench::RunMain("peer_snapshot_bench",
                                   [&] { return flatshard::Main(argc, argv); });
}
