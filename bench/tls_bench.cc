// What security costs a step (issue #12 §6): the demo job
// (examples/mlp-job.yaml, 4 ranks) trained on two real local clusters side by
// side, one plaintext and open, one under mutual TLS on every channel with a
// bearer token on every client call and the audit log on, interleaved
// (plain, secure, plain, secure, ...: this machine is noisy), the median step
// time of each and their ratio. The data plane (Gloo between workers) is the
// same in both: TLS covers the control plane, which is what the issue targets.
// Also the time of a unary call (GetJob) over each, the control plane alone.
//
//   tls_bench [--workers 4] [--steps 40] [--rounds 5] [--calls 500]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/time/clock.h"

#include "bench/bench_flags.h"
#include "bench/cluster_bench.h"
#include "client/cluster_security.h"
#include "client/flatshard_client.h"
#include "client/local_cluster.h"
#include "core/job_spec_yaml.h"
#include "storage/spec_files.h"

namespace flatshard {
namespace {

struct Flags {
  int workers = 4;
  int steps = 40;
  int rounds = 5;
  int calls = 500;
};

void AddFlags(CLI::App& app, Flags& f) {
  app.add_option("--workers", f.workers, "Worker processes")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--steps", f.steps, "Training steps per round")
      ->check(flatshard::bench::AtLeastOne())
      ->capture_default_str();
  app.add_option("--rounds", f.rounds, "Interleaved rounds, plaintext and TLS (medians)")
      ->check(flatshard::bench::AtLeastOne())
      ->capture_default_str();
  app.add_option("--calls", f.calls, "Unary client calls timed per round")
      ->check(flatshard::bench::AtLeastOne())
      ->capture_default_str();
}

void Die(const absl::Status& status) {
  std::fprintf(stderr, "tls_bench: %s\n", status.ToString().c_str());
  std::exit(1);
}

struct Side {
  std::string name;
  std::unique_ptr<LocalCluster> cluster;
  std::unique_ptr<FlatshardClient> client;
  std::vector<double> step_medians;
  std::vector<double> call_medians;
};

std::vector<double> CallTimes(FlatshardClient& client, const std::string& job, int calls) {
  std::vector<double> times;
  for (int i = 0; i < calls; ++i) {
    const absl::Time start = absl::Now();
    if (absl::Status s = client.GetJob(job).status(); !s.ok()) Die(s);
    times.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  return times;
}

int Main(int argc, char** argv) {
  Flags flags;
  CLI::App app{
      "tls_bench: a training step and a unary client call over mutual TLS against plaintext, "
      "on two real local clusters, interleaved"};
  AddFlags(app, flags);
  CLI11_PARSE(app, argc, argv);
  char dir[] = "/tmp/tls-bench.XXXXXX";
  if (::mkdtemp(dir) == nullptr) return 1;
  absl::StatusOr<ClusterSecurity> security = PrepareClusterSecurity(std::string(dir) + "/security");
  if (!security.ok()) Die(security.status());
  auto spec = LoadJobSpecFile(std::string(FLATSHARD_SOURCE_DIR) + "/examples/mlp-job.yaml");
  if (!spec.ok()) Die(spec.status());
  spec->set_world_size(flags.workers);

  Side sides[2] = {{"plaintext", nullptr, nullptr, {}, {}},
                   {"mTLS+tokens", nullptr, nullptr, {}, {}}};
  for (int s = 0; s < 2; ++s) {
    LocalClusterOptions options;
    options.workers = flags.workers;
    options.bin_dir = FLATSHARD_BIN_DIR;
    options.checkpoint_dir = std::string(dir) + "/checkpoints-" + std::to_string(s);
    if (s == 1) {
      options.coordinator_flags = security->CoordinatorFlags();
      options.every_worker_flags = security->WorkerFlags();
    }
    auto cluster = LocalCluster::Start(options);
    if (!cluster.ok()) Die(cluster.status());
    sides[s].cluster = *std::move(cluster);
    sides[s].client = std::make_unique<FlatshardClient>(
        s == 1 ? security->AdminTarget(sides[s].cluster->address())
               : CoordinatorTarget{sides[s].cluster->address(), {}, "", ""});
    if (absl::Status created = sides[s].client->CreateJob(*spec).status(); !created.ok()) {
      Die(created);
    }
    auto ready = sides[s].client->WaitForState(spec->name(), {v1::READY}, absl::Seconds(120));
    if (!ready.ok()) Die(ready.status());
  }
  for (int round = 0; round < flags.rounds; ++round) {
    for (Side& side : sides) {
      side.step_medians.push_back(Median(StepTimes(*side.client, spec->name(), flags.steps)));
      side.call_medians.push_back(Median(CallTimes(*side.client, spec->name(), flags.calls)));
      std::printf("round %d %-12s step %.2f ms  GetJob %.0f us\n", round, side.name.c_str(),
                  side.step_medians.back() * 1e3, side.call_medians.back() * 1e6);
      std::fflush(stdout);
    }
  }
  const double plain_step = Median(sides[0].step_medians);
  const double secure_step = Median(sides[1].step_medians);
  const double plain_call = Median(sides[0].call_medians);
  const double secure_call = Median(sides[1].call_medians);
  std::printf(
      "\nworkers %d, %d steps x %d rounds (medians of per-round medians)\n"
      "step: plaintext %.2f ms, mTLS+tokens %.2f ms, ratio %.3f\n"
      "GetJob: plaintext %.0f us, mTLS+tokens %.0f us, ratio %.2f\n",
      flags.workers, flags.steps, flags.rounds, plain_step * 1e3, secure_step * 1e3,
      secure_step / plain_step, plain_call * 1e6, secure_call * 1e6, secure_call / plain_call);
  for (Side& side : sides) side.cluster->Stop();
  return 0;
}

}  // namespace
}  // namespace flatshard

int main(int argc, char** argv) {
  return flatshard::bench::RunMain("tls_bench", [&] { return flatshard::Main(argc, argv); });
}
