// The coordinator's cost per step, apart from the workers' compute.
//
// 1. Fan-out round trip over gRPC on loopback: the real coordinator path
//    (TrainingJob -> CommandSequencer -> GrpcWorkerClient) driving 1, 4 and 8
//    echo workers (WorkerService servers in this process that answer Execute
//    at once), with the MLP job's real step program as the payload. p50/p99 of
//    one step, next to a bare unary gRPC round trip for scale.
// 2. Scale: the same path with 256 and 1,024 simulated workers (in-process
//    WorkerClients that answer inline): the coordinator's own per-step cost;
//    and a failure's abort and probe of 1,024 and 16,384 of them at once.
// 3. The coordinator against a bare fan-out (issue #14 §2: <= 1.1x), to echo
//    workers in 8 separate processes: per round, a step through the real path
//    and the same CommandBatch sent with the bare gRPC callback API to every
//    process at once (wait for all), interleaved; the ratio of their medians.
//    Then the same with a state dir (SQLite), its journal records written
//    ahead (TrainingJobOptions::journal_ahead, the default), and again with
//    each written on its step's path, as before 2026-12-02.
// 4. Where part 3's ratio goes: the same batch through GrpcWorkerClient alone
//    and through CommandSequencer::Run, interleaved with the bare fan-out.
//
//   control_plane_bench [--steps 2000] [--sim-steps 200] [--processes 8]
//                       [--rounds 5] [--stall-timeout 300]
#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <unistd.h>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "rpc/grpc_server.h"

#include "bench/bench_flags.h"
#include "bench/forked_servers.h"
#include "coordinator/command_sequencer.h"
#include "coordinator/forwarding_worker_client.h"
#include "coordinator/grpc_worker_client.h"
#include "coordinator/state_store.h"
#include "coordinator/training_job.h"
#include "coordinator/worker_fan_out.h"
#include "core/job_config.h"
#include "core/job_spec_yaml.h"
#include "flatshard/v1/worker.grpc.pb.h"
#include "storage/spec_files.h"

namespace flatshard {
namespace {

// A worker that does no work: what is left of a step is the control plane.
class EchoWorker final : public v1::WorkerService::Service {
 public:
  grpc::Status Configure(grpc::ServerContext*, const v1::ConfigureRequest* request,
                         v1::ConfigureResponse*) override {
    rank_ = request->rank();
    return grpc::Status::OK;
  }
  grpc::Status Execute(grpc::ServerContext*, const v1::CommandBatch* batch,
                       v1::CommandResult* result) override {
    result->set_seq(batch->seq());
    result->set_rank(rank_);
    result->set_loss(1.0);
    result->set_samples(8);
    return grpc::Status::OK;
  }
  grpc::Status GetStatus(grpc::ServerContext*, const v1::GetStatusRequest*,
                         v1::GetStatusResponse* response) override {
    response->set_rank(rank_);
    return grpc::Status::OK;
  }

 private:
  std::atomic<int> rank_{0};
};

// In-process: answers inline, so only the coordinator's work is timed.
class SimulatedWorker final : public WorkerClient {
 public:
  explicit SimulatedWorker(int rank) : rank_(rank) {}
  void Execute(const v1::CommandBatch* batch, absl::Time, ExecuteDone done) override {
    v1::CommandResult result;
    result.set_seq(batch->seq());
    result.set_rank(rank_);
    result.set_loss(1.0);
    result.set_samples(8);
    done(std::move(result));
  }
  void CancelAll() override {}
  void ConfigureAsync(v1::ConfigureRequest, absl::Time, absl::Time, ConfigureDone done) override {
    done(absl::OkStatus());
  }
  void AbortAsync(uint64_t, const std::string&, absl::Time, AbortDone done) override {
    done(absl::OkStatus());
  }
  void AwaitSave(const std::string&, absl::Time, AwaitSaveDone done) override {
    done(absl::UnimplementedError("fake worker"));
  }
  void GetStatusAsync(absl::Time, GetStatusDone done) override { done(v1::GetStatusResponse()); }
  absl::Status Summon(const v1::CommandBatch&, absl::Time, const ChunkSink&) override {
    return absl::OkStatus();
  }
  void JoinSummonAsync(const v1::CommandBatch*, absl::Time, JoinSummonDone done) override {
    done(absl::OkStatus());
  }
  void Disconnect() override {}  // no connection of its own
  std::string address() const override { return absl::StrCat("sim-", rank_); }

 private:
  int rank_;
};

// The real client, keeping a copy of the first step batch it sent (once: a
// copy per step would be the bench's cost, not the coordinator's): the bare
// fan-out sends what the coordinator does.
class CapturingClient final : public ForwardingWorkerClient {
 public:
  CapturingClient(std::unique_ptr<WorkerClient> inner, v1::CommandBatch* last)
      : ForwardingWorkerClient(std::move(inner)), last_(last) {}
  void Execute(const v1::CommandBatch* batch, absl::Time deadline, ExecuteDone done) override {
    if (last_ != nullptr && !last_->has_step() && batch->has_step()) *last_ = *batch;
    ForwardingWorkerClient::Execute(batch, deadline, std::move(done));
  }

 private:
  v1::CommandBatch* last_;
};

// One bare fan-out: `batch` to every stub at once with the callback API,
// waiting for every answer. Timed whole, as a coordinator's step is: its
// call contexts and results made and freed (they were outside the timing
// before 2026-11-30, which charged their cost to the coordinator alone).
double BareFanOutSeconds(std::vector<std::unique_ptr<v1::WorkerService::Stub>>& stubs,
                         const v1::CommandBatch& batch) {
  const absl::Time start = absl::Now();
  {
    std::mutex mu;
    std::condition_variable cv;
    size_t pending = stubs.size();
    std::vector<grpc::ClientContext> contexts(stubs.size());
    std::vector<v1::CommandResult> results(stubs.size());
    for (size_t i = 0; i < stubs.size(); ++i) {
      stubs[i]->async()->Execute(&contexts[i], &batch, &results[i], [&](const grpc::Status&) {
        std::lock_guard<std::mutex> lock(mu);
        if (--pending == 0) cv.notify_one();
      });
    }
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return pending == 0; });
  }
  return absl::ToDoubleSeconds(absl::Now() - start);
}

// Through the coordinator's clients (GrpcWorkerClient), without the sequencer.
double ClientFanOutSeconds(const std::vector<std::shared_ptr<WorkerClient>>& clients,
                           const v1::CommandBatch& batch) {
  std::mutex mu;
  std::condition_variable cv;
  size_t pending = clients.size();
  const absl::Time start = absl::Now();
  for (const std::shared_ptr<WorkerClient>& client : clients) {
    client->Execute(&batch, start + absl::Minutes(10),
                    [&](const absl::StatusOr<v1::CommandResult>&) {
                      std::lock_guard<std::mutex> lock(mu);
                      if (--pending == 0) cv.notify_one();
                    });
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return pending == 0; });
  return absl::ToDoubleSeconds(absl::Now() - start);
}

struct Percentiles {
  double p50_us = 0, p99_us = 0, mean_us = 0;
};

Percentiles Summarize(std::vector<double> seconds) {
  std::sort(seconds.begin(), seconds.end());
  Percentiles p;
  p.p50_us = seconds[seconds.size() / 2] * 1e6;
  p.p99_us = seconds[std::min(seconds.size() - 1, seconds.size() * 99 / 100)] * 1e6;
  double sum = 0;
  for (double s : seconds) sum += s;
  p.mean_us = sum / static_cast<double>(seconds.size()) * 1e6;
  return p;
}

v1::JobSpec Spec(int world) {
  auto spec = LoadJobSpecFile(std::string(FLATSHARD_SOURCE_DIR) + "/examples/mlp-job.yaml");
  if (!spec.ok()) {
    std::fprintf(stderr, "%s\n", std::string(spec.status().message()).c_str());
    std::exit(1);
  }
  spec->set_world_size(world);
  spec->mutable_data()->set_global_batch_size(8 * world);
  return *spec;
}

// Steps through TrainingJob with `connect` (and `state`, a state store, when
// not null: every step journals its batch and progress as a coordinator with
// --state-dir does) under `limits`; per-step wall times.
std::vector<double> TimeSteps(int world, int steps, WorkerConnector connect,
                              const std::vector<std::string>& addresses, const BatchLimits& limits,
                              StateStore* state = nullptr,
                              const std::function<void()>& between = nullptr,
                              bool journal_ahead = true) {
  const v1::JobSpec spec = Spec(world);
  absl::StatusOr<JobConfig> config = JobConfigFromProto(spec);
  TrainingJobOptions options;
  options.connect = std::move(connect);
  options.state = state;
  options.journal_ahead = journal_ahead;
  options.batch = limits;
  auto job = TrainingJob::Create(spec, *config, options);
  std::vector<WorkerRecord> members(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    members[static_cast<size_t>(r)].worker_id = absl::StrCat("w", r);
    members[static_cast<size_t>(r)].address =
        addresses.empty() ? "" : addresses[static_cast<size_t>(r)];
    members[static_cast<size_t>(r)].rank = r;
  }
  if (absl::Status s = (*job)->Form(members); !s.ok()) {
    std::fprintf(stderr, "form: %s\n", std::string(s.message()).c_str());
    std::exit(1);
  }
  std::vector<double> times;
  times.reserve(static_cast<size_t>(steps));
  absl::Time last = absl::Now();
  absl::Status s = (*job)->Train(steps + steps / 10, 0, [&](const v1::StepResult&) {
    times.push_back(absl::ToDoubleSeconds(absl::Now() - last));
    if (between) between();  // not part of the next step's time
    last = absl::Now();
    return true;
  });
  if (!s.ok()) {
    std::fprintf(stderr, "train: %s\n", std::string(s.message()).c_str());
    std::exit(1);
  }
  times.erase(times.begin(), times.begin() + steps / 10);  // warm-up
  return times;
}

double BareRoundTripUs(const std::string& address, int iters) {
  auto stub =
      v1::WorkerService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    grpc::ClientContext context;
    v1::GetStatusRequest request;
    v1::GetStatusResponse response;
    const absl::Time start = absl::Now();
    (void)stub->GetStatus(&context, request, &response);
    times.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  return Summarize(times).p50_us;
}

int Main(int argc, char** argv) {
  int steps = 2000;
  int sim_steps = 200;
  int processes = 8;
  int rounds = 5;
  double stall_timeout_s = absl::ToDoubleSeconds(BatchLimits().stall_timeout);
  CLI::App app{
      "control_plane_bench: the coordinator's per-step control path against a bare gRPC fan-out "
      "to the same worker processes, and its own work with in-process simulated workers"};
  app.add_option("--steps", steps, "Steps per measured round")
      ->check(flatshard::bench::AtLeastOne())
      ->capture_default_str();
  app.add_option("--sim-steps", sim_steps, "Steps with simulated workers")
      ->check(flatshard::bench::AtLeastOne())
      ->capture_default_str();
  app.add_option("--processes", processes, "Worker processes for the fan-out")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--rounds", rounds, "Interleaved rounds (medians)")
      ->check(flatshard::bench::AtLeastOne())
      ->capture_default_str();
  app.add_option("--stall-timeout", stall_timeout_s,
                 "The coordinator's --stall-timeout (0: no stall watching)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  bool deadlock_detection = false;
  bench::AddAbseilDeadlockDetectionFlag(app, deadlock_detection);
  CLI11_PARSE(app, argc, argv);
  bench::ApplyAbseilDeadlockDetection(deadlock_detection);
  BatchLimits limits;
  limits.stall_timeout = absl::Seconds(stall_timeout_s);
  // Forked first: a process must not fork once gRPC's threads exist.
  bench::ForkedServers echo =
      bench::ForkedServers::Start(processes, [](int, const auto& report, const auto& serve) {
        EchoWorker service;
        auto server = GrpcServer::Start("127.0.0.1:0", {&service});
        if (!server.ok()) ::_exit(1);
        report((*server)->address());
        serve();
        (*server)->Shutdown();
      });
  const v1::JobSpec spec = Spec(1);
  absl::StatusOr<JobConfig> config = JobConfigFromProto(spec);
  auto units = JobUnits(*config);
  std::printf("payload: the MLP job's step program (%d units)\n\n",
              static_cast<int>(units->size()));

  std::vector<std::unique_ptr<EchoWorker>> services;
  std::vector<std::unique_ptr<GrpcServer>> servers;
  std::vector<std::string> addresses;
  for (int i = 0; i < 8; ++i) {
    services.push_back(std::make_unique<EchoWorker>());
    auto server = GrpcServer::Start("127.0.0.1:0", {services.back().get()});
    addresses.push_back((*server)->address());
    servers.push_back(*std::move(server));
  }
  std::printf("bare unary gRPC round trip (GetStatus), p50: %.1f us\n\n",
              BareRoundTripUs(addresses[0], 2000));
  std::printf("| workers | transport | steps | p50 | p99 | mean | per worker (mean) |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (int world : {1, 4, 8}) {
    const Percentiles p = Summarize(TimeSteps(
        world, steps,
        [](const WorkerRecord& w, size_t world_size) {
          return std::make_unique<GrpcWorkerClient>(w.address, nullptr, "",
                                                    WorkerChannelIdle(world_size));
        },
        addresses, limits));
    std::printf("| %d | gRPC loopback | %d | %.0f us | %.0f us | %.0f us | %.1f us |\n", world,
                steps, p.p50_us, p.p99_us, p.mean_us, p.mean_us / world);
  }
  for (int world : {256, 1024}) {
    const Percentiles p = Summarize(TimeSteps(
        world, sim_steps,
        [](const WorkerRecord& w, size_t) {
          return std::make_unique<SimulatedWorker>(std::atoi(w.worker_id.c_str() + 1));
        },
        {}, limits));
    std::printf("| %d | simulated (in-process) | %d | %.0f us | %.0f us | %.0f us | %.2f us |\n",
                world, sim_steps, p.p50_us, p.p99_us, p.mean_us, p.mean_us / world);
  }
  // 2b. A failure's fan-outs at scale: one abort, then one probe, of every
  // worker at once (worker_fan_out.h) on the calling thread.
  std::printf("\n| workers | fan-out (simulated, in-process) | reps | p50 | p99 | per worker |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (int world : {1024, 16384}) {
    std::vector<std::unique_ptr<SimulatedWorker>> owned;
    std::vector<WorkerClient*> clients;
    for (int r = 0; r < world; ++r) {
      owned.push_back(std::make_unique<SimulatedWorker>(r));
      clients.push_back(owned.back().get());
    }
    std::vector<double> aborts, probes;
    for (int rep = 0; rep < sim_steps; ++rep) {
      absl::Time start = absl::Now();
      (void)AbortAll(clients, 1, "the bench aborts", start + absl::Seconds(1));
      aborts.push_back(absl::ToDoubleSeconds(absl::Now() - start));
      start = absl::Now();
      (void)GetStatusAll(clients, start + absl::Seconds(1));
      probes.push_back(absl::ToDoubleSeconds(absl::Now() - start));
    }
    for (const auto& [what, times] : {std::pair{"AbortAll", &aborts}, {"GetStatusAll", &probes}}) {
      const Percentiles p = Summarize(*times);
      std::printf("| %d | %s | %d | %.0f us | %.0f us | %.2f us |\n", world, what, sim_steps,
                  p.p50_us, p.p99_us, p.p50_us / world);
    }
  }

  // 3. Coordinator vs bare fan-out to `processes` separate processes.
  std::printf("\n%d echo workers in separate processes, %d rounds of %d steps each way\n\n",
              processes, rounds, steps);
  std::printf(
      "| round | bare fan-out p50 | coordinator step p50 | ratio | bare fan-out p50 | coordinator "
      "with a state dir (SQLite) p50 | ratio | bare fan-out p50 | state dir, each step journaled "
      "on its path p50 | ratio |\n|---|---|---|---|---|---|---|---|---|---|\n");
  char state_dir[] = "/tmp/control-plane-bench.XXXXXX";
  if (::mkdtemp(state_dir) == nullptr) return 1;
  absl::StatusOr<std::unique_ptr<StateStore>> store = StateStore::Open(state_dir);
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", std::string(store.status().message()).c_str());
    return 1;
  }
  v1::CommandBatch last;
  std::vector<std::unique_ptr<v1::WorkerService::Stub>> stubs;
  for (const std::string& address : echo.lines()) {
    stubs.push_back(v1::WorkerService::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials())));
  }
  auto connect = [&last](const WorkerRecord& w, size_t world_size) {
    return std::make_unique<CapturingClient>(
        std::make_unique<GrpcWorkerClient>(w.address, nullptr, "", WorkerChannelIdle(world_size)),
        w.rank == 0 ? &last : nullptr);
  };
  // Interleaved step by step: after each coordinator step, one bare fan-out
  // of the batch it sent (A B A B ...), so both see the same machine.
  std::vector<double> coordinator_ratios, durable_ratios, on_path_ratios;
  for (int round = 0; round < rounds; ++round) {
    std::vector<double> bare;
    const auto fan_out = [&] {
      if (last.has_step()) bare.push_back(BareFanOutSeconds(stubs, last));
    };
    const Percentiles coordinator =
        Summarize(TimeSteps(processes, steps, connect, echo.lines(), limits, nullptr, fan_out));
    const Percentiles b = Summarize(bare);
    bare.clear();
    const Percentiles durable = Summarize(
        TimeSteps(processes, steps, connect, echo.lines(), limits, store->get(), fan_out));
    const Percentiles b2 = Summarize(bare);
    bare.clear();
    // The journal as it was before 2026-12-02: each step's record written
    // on its own path, before it is sent.
    const Percentiles on_path = Summarize(
        TimeSteps(processes, steps, connect, echo.lines(), limits, store->get(), fan_out, false));
    const Percentiles b3 = Summarize(bare);
    coordinator_ratios.push_back(coordinator.p50_us / b.p50_us);
    durable_ratios.push_back(durable.p50_us / b2.p50_us);
    on_path_ratios.push_back(on_path.p50_us / b3.p50_us);
    std::printf(
        "| %d | %.0f us | %.0f us | %.2f | %.0f us | %.0f us | %.2f | %.0f us | %.0f us | "
        "%.2f |\n",
        round, b.p50_us, coordinator.p50_us, coordinator_ratios.back(), b2.p50_us, durable.p50_us,
        durable_ratios.back(), b3.p50_us, on_path.p50_us, on_path_ratios.back());
  }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf(
      "\nmedian ratio to the bare fan-out: coordinator %.2f, with a state dir %.2f, with each "
      "step journaled on its path %.2f (payload %zu bytes)\n",
      median(coordinator_ratios), median(durable_ratios), median(on_path_ratios),
      last.ByteSizeLong());

  // 4. Where the coordinator's step goes: the same step batch (carrying its
  // digest, as TrainingJob's do) to the same processes through each layer in
  // turn, interleaved step by step; the rest of part 3's ratio is
  // TrainingJob's own (building the batch, the step's result).
  {
    std::vector<std::shared_ptr<WorkerClient>> clients;
    for (const std::string& address : echo.lines()) {
      clients.push_back(std::make_shared<GrpcWorkerClient>(address));
    }
    CommandSequencer sequencer(clients, 1, limits);
    std::vector<double> bare, client, sequenced;
    for (int i = 0; i < steps * rounds; ++i) {
      bare.push_back(BareFanOutSeconds(stubs, last));
      client.push_back(ClientFanOutSeconds(clients, last));
      const absl::Time start = absl::Now();
      if (absl::Status s = sequencer.Run(last).status(); !s.ok()) {
        std::fprintf(stderr, "sequencer: %s\n", std::string(s.message()).c_str());
        std::exit(1);  // the echo processes die with this one (PR_SET_PDEATHSIG)
      }
      sequenced.push_back(absl::ToDoubleSeconds(absl::Now() - start));
    }
    const double b = Summarize(bare).p50_us;
    std::printf("\n| layer (%d steps each, interleaved) | p50 | ratio to bare |\n|---|---|---|\n",
                steps * rounds);
    std::printf("| bare fan-out | %.0f us | 1.00 |\n", b);
    for (const auto& [name, times] :
         {std::pair<const char*, std::vector<double>*>{"GrpcWorkerClient", &client},
          {"CommandSequencer::Run", &sequenced}}) {
      const double p50 = Summarize(*times).p50_us;
      std::printf("| %s | %.0f us | %.2f |\n", name, p50, p50 / b);
    }
  }
  store->reset();
  std::filesystem::remove_all(state_dir);
  stubs.clear();
  echo.Stop();
  return 0;
}

}  // namespace
}  // namespace flatshard

int main(int argc, char** argv) {
  return flatshard::bench::RunMain("control_plane_bench",
                                   [&] { return flatshard::Main(argc, argv); });
}
