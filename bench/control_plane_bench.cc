// The coordinator's cost per step, apart from the workers' compute.
//
// 1. Fan-out round trip over gRPC on loopback: the real coordinator path
//    (TrainingJob -> CommandSequencer -> GrpcWorkerClient) driving 1, 4 and 8
//    echo workers (WorkerService servers in this process that answer Execute
//    at once), with the MLP job's real step program as the payload. p50/p99 of
//    one step, next to a bare unary gRPC round trip for scale.
// 2. Scale: the same path with 256 and 1,024 simulated workers (in-process
//    WorkerClients that answer inline): the coordinator's own per-step cost.
//
//   control_plane_bench [--steps 2000] [--sim-steps 200]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "rpc/grpc_server.h"

#include "coordinator/grpc_worker_client.h"
#include "coordinator/training_job.h"
#include "core/job_config.h"
#include "core/job_spec_yaml.h"
#include "flatshard/v1/worker.grpc.pb.h"

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
  absl::Status Configure(const v1::ConfigureRequest&, absl::Time) override {
    return absl::OkStatus();
  }
  absl::Status Abort(uint64_t, const std::string&, absl::Time) override { return absl::OkStatus(); }
  absl::StatusOr<v1::GetStatusResponse> GetStatus(absl::Time) override {
    return v1::GetStatusResponse();
  }
  absl::StatusOr<v1::CommandResult> AwaitSave(const std::string&, absl::Time) override {
    return absl::UnimplementedError("fake worker");
  }
  absl::Status Summon(const v1::CommandBatch&, absl::Time, const ChunkSink&) override {
    return absl::OkStatus();
  }
  std::string address() const override { return absl::StrCat("sim-", rank_); }

 private:
  int rank_;
};

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

// Steps through TrainingJob with `connect`; per-step wall times.
std::vector<double> TimeSteps(
    int world, int steps, std::function<std::unique_ptr<WorkerClient>(const WorkerRecord&)> connect,
    const std::vector<std::string>& addresses) {
  const v1::JobSpec spec = Spec(world);
  absl::StatusOr<JobConfig> config = JobConfigFromProto(spec);
  TrainingJobOptions options;
  options.connect = std::move(connect);
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
    const absl::Time now = absl::Now();
    times.push_back(absl::ToDoubleSeconds(now - last));
    last = now;
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
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--steps") steps = std::atoi(argv[i + 1]);
    if (flag == "--sim-steps") sim_steps = std::atoi(argv[i + 1]);
  }
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
        [](const WorkerRecord& w) { return std::make_unique<GrpcWorkerClient>(w.address); },
        addresses));
    std::printf("| %d | gRPC loopback | %d | %.0f us | %.0f us | %.0f us | %.1f us |\n", world,
                steps, p.p50_us, p.p99_us, p.mean_us, p.mean_us / world);
  }
  for (int world : {256, 1024}) {
    const Percentiles p = Summarize(TimeSteps(world, sim_steps,
                                              [](const WorkerRecord& w) {
                                                return std::make_unique<SimulatedWorker>(
                                                    std::atoi(w.worker_id.c_str() + 1));
                                              },
                                              {}));
    std::printf("| %d | simulated (in-process) | %d | %.0f us | %.0f us | %.0f us | %.2f us |\n",
                world, sim_steps, p.p50_us, p.p99_us, p.mean_us, p.mean_us / world);
  }
  return 0;
}

}  // namespace
}  // namespace flatshard

int main(int argc, char** argv) { return flatshard::Main(argc, argv); }
