// A failure's and a formation's fan-outs over real gRPC at scale: the
// coordinator's GrpcWorkerClients, one per worker, each with its own address
// and so its own TCP connection, to echo servers in other processes. For
// each world size, timed whole on the coordinator's one calling thread:
//   - making the clients (a channel each);
//   - the first probe (GetStatusAll), which connects every channel;
//   - probes and aborts (AbortAll) of the connected world;
//   - ConfigureAll (each call a wait-for-ready GetStatus, then the
//     Configure; the echo answers at once, so no rendezvous wait), over the
//     connected channels and, as a formation does, over new ones.
// The servers answer inline, and on this machine share its cores with the
// coordinator: each number is an upper bound on what the coordinator's side
// costs. Every fan-out runs under the coordinator's own deadlines, grown with
// the burst (FanOutTimeout, coordinator/worker_fan_out.h, sized from these
// numbers), and the calls that outran them are counted.
//
//   fan_out_bench [--worlds 1024,4096,16384] [--processes 8] [--reps 5]
//                 [--abseil-deadlock-detection]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>
#include <sys/resource.h>
#include <unistd.h>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

#include "bench/bench_flags.h"
#include "bench/forked_servers.h"
#include "coordinator/grpc_worker_client.h"
#include "coordinator/training_job_options.h"
#include "coordinator/worker_fan_out.h"
#include "flatshard/v1/worker.grpc.pb.h"

namespace flatshard {
namespace {

// Answers every call of a fan-out at once.
class EchoWorker final : public v1::WorkerService::Service {
 public:
  grpc::Status Configure(grpc::ServerContext*, const v1::ConfigureRequest*,
                         v1::ConfigureResponse*) override {
    return grpc::Status::OK;
  }
  grpc::Status GetStatus(grpc::ServerContext*, const v1::GetStatusRequest*,
                         v1::GetStatusResponse* response) override {
    response->set_progress(1);
    return grpc::Status::OK;
  }
  grpc::Status Abort(grpc::ServerContext*, const v1::AbortRequest*, v1::AbortResponse*) override {
    return grpc::Status::OK;
  }
};

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

// This process's CPU time (every thread's: gRPC's do the sending and
// receiving), apart from the servers'.
absl::Duration CpuTime() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return absl::DurationFromTimeval(usage.ru_utime) + absl::DurationFromTimeval(usage.ru_stime);
}

struct Took {
  absl::Duration wall;
  absl::Duration cpu;  // the coordinator's side alone
  size_t failed = 0;   // calls that did not succeed within the deadline
};

// Runs `fan_out` under the coordinator's own deadlines and returns how long
// it took and how many calls failed: the servers are all up, so a failure is
// a deadline the burst outran (the first is printed).
template <typename Statuses>
Took Timed(const char* what, const std::function<Statuses()>& fan_out) {
  const absl::Duration cpu = CpuTime();
  const absl::Time start = absl::Now();
  const Statuses outcomes = fan_out();
  Took took{absl::Now() - start, CpuTime() - cpu};
  std::string first;
  for (const auto& outcome : outcomes) {
    absl::Status s;
    if constexpr (std::is_same_v<typename Statuses::value_type, absl::Status>) {
      s = outcome;
    } else {
      s = outcome.status();
    }
    if (!s.ok() && took.failed++ == 0) first = std::string(s.message());
  }
  if (took.failed > 0) {
    std::fprintf(stderr, "%s: %zu of %zu calls failed, the first: %s\n", what, took.failed,
                 outcomes.size(), first.c_str());
  }
  return took;
}

int Main(int argc, char** argv) {
  CLI::App app{"The coordinator's fan-outs (probe, abort, configure) over real gRPC at scale"};
  std::vector<int> worlds = {1024, 4096, 16384};
  int processes = 8;
  int reps = 5;
  app.add_option("--worlds", worlds, "World sizes, each a set of distinct worker addresses")
      ->delimiter(',')
      ->check(bench::AtLeastOne())
      ->capture_default_str();
  app.add_option("--processes", processes, "Echo server processes the addresses are spread over")
      ->check(bench::AtLeastOne())
      ->capture_default_str();
  app.add_option("--reps", reps, "Probes, aborts and configures timed per world")
      ->check(bench::AtLeastOne())
      ->capture_default_str();
  bool deadlock_detection = false;
  bench::AddAbseilDeadlockDetectionFlag(app, deadlock_detection);
  CLI11_PARSE(app, argc, argv);
  bench::ApplyAbseilDeadlockDetection(deadlock_detection);
  // A socket per worker here, and one per worker on the servers' side.
  rlimit files{};
  ::getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = files.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &files);
  const int largest = *std::max_element(worlds.begin(), worlds.end());
  if (static_cast<rlim_t>(largest) + 1024 > files.rlim_cur) {
    std::fprintf(stderr, "--worlds %d needs more open files than this process may have (%lu)\n",
                 largest, static_cast<unsigned long>(files.rlim_cur));
    return 1;
  }
  // Forked first: a process must not fork once gRPC's threads exist.
  const int ports = (largest + processes - 1) / processes;
  // Each server listens on `ports` loopback ports (a worker's address each).
  bench::ForkedServers echo =
      bench::ForkedServers::Start(processes, [ports](int, const auto& report, const auto& serve) {
        EchoWorker service;
        grpc::ServerBuilder builder;
        std::vector<int> bound(static_cast<size_t>(ports));
        for (int& port : bound) {
          builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
        }
        builder.RegisterService(&service);
        std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
        if (server == nullptr) ::_exit(1);
        report(absl::StrJoin(bound, " "));
        serve();
        server->Shutdown();
      });
  std::vector<std::string> addresses;
  for (const std::string& line : echo.lines()) {
    for (absl::string_view port : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
      addresses.push_back(absl::StrCat("127.0.0.1:", port));
    }
  }
  if (addresses.size() != static_cast<size_t>(processes) * static_cast<size_t>(ports)) {
    std::fprintf(stderr, "the echo servers bound %zu ports, not %d\n", addresses.size(),
                 processes * ports);
    return 1;
  }
  std::printf(
      "%d echo server processes, %d ports each; %d reps a row. Each cell: wall ms, p50 (max); "
      "the coordinator process's CPU time per worker; calls failed (deadline)\n\n",
      processes, ports, reps);
  std::printf(
      "| workers | deadlines: connecting, connected | make clients (ms) | first probe (connects) | "
      "formation (connects) | probe | abort | configure |\n|---|---|---|---|---|---|---|---|\n");
  for (const int world : worlds) {
    const size_t n = static_cast<size_t>(world);
    std::vector<std::unique_ptr<GrpcWorkerClient>> owned;
    std::vector<WorkerClient*> clients;
    // New clients, spread over the processes as workers over hosts; each
    // channel stays connected as the coordinator's do (WorkerChannelIdle).
    const auto make_clients = [&] {
      owned.clear();
      clients.clear();
      for (size_t r = 0; r < n; ++r) {
        const size_t process = r % static_cast<size_t>(processes);
        const size_t port = r / static_cast<size_t>(processes);
        owned.push_back(std::make_unique<GrpcWorkerClient>(
            addresses[process * static_cast<size_t>(ports) + port], nullptr, "",
            WorkerChannelIdle(n)));
        clients.push_back(owned.back().get());
      }
    };
    absl::Time start = absl::Now();
    make_clients();
    const absl::Duration make = absl::Now() - start;
    // The coordinator's deadlines: a recovery's probe (TrainingJobOptions'
    // probe_timeout, the longer of the two; the sequencer's is 1 s) grown by
    // FanOutTimeout, for new channels (a restarted coordinator's probe) and
    // connected ones (a stall's probe, an abort); a formation's connect
    // grace is ConfigureAll's own.
    const absl::Duration one = TrainingJobOptions().probe_timeout;
    const absl::Duration connecting = FanOutTimeout(one, n, FanOutChannels::kConnecting);
    const absl::Duration connected = FanOutTimeout(one, n);
    const auto within = [](absl::Duration d) { return [d] { return absl::Now() + d; }; };
    const auto configure_deadline = within(absl::Minutes(2));
    using Probes = std::vector<absl::StatusOr<v1::GetStatusResponse>>;
    using Outcomes = std::vector<absl::Status>;
    const auto configure = [&] {
      std::vector<v1::ConfigureRequest> requests(n);
      for (size_t r = 0; r < n; ++r) requests[r].set_rank(static_cast<int>(r));
      return ConfigureAll(clients, std::move(requests), configure_deadline(), {});
    };
    const Took first =
        Timed<Probes>("first probe", [&] { return GetStatusAll(clients, within(connecting)()); });
    std::vector<Took> probes, aborts, configures;
    for (int rep = 0; rep < reps; ++rep) {
      probes.push_back(
          Timed<Probes>("probe", [&] { return GetStatusAll(clients, within(connected)()); }));
      aborts.push_back(Timed<Outcomes>(
          "abort", [&] { return AbortAll(clients, 1, "the bench aborts", within(connected)()); }));
      configures.push_back(Timed<Outcomes>("configure", configure));
    }
    start = absl::Now();
    owned.clear();
    const absl::Duration closed = absl::Now() - start;
    // A formation as it happens: every channel new, each call waiting for
    // its connection within the connect grace.
    make_clients();
    const Took formation = Timed<Outcomes>("formation", configure);
    // The median's wall time (the slowest's), the median's coordinator CPU
    // time per worker, and the failed calls of all reps.
    const auto cell = [world](std::vector<Took> v) {
      size_t failed = 0;
      for (const Took& t : v) failed += t.failed;
      std::sort(v.begin(), v.end(), [](const Took& a, const Took& b) { return a.wall < b.wall; });
      const Took& median = v[v.size() / 2];
      return absl::StrFormat("%.0f (%.0f); %.0f us; %zu failed", Ms(median.wall), Ms(v.back().wall),
                             absl::ToDoubleMicroseconds(median.cpu) / world, failed);
    };
    std::printf("| %d | %.1f s, %.1f s | %.0f | %s | %s | %s | %s | %s |\n", world,
                absl::ToDoubleSeconds(connecting), absl::ToDoubleSeconds(connected), Ms(make),
                cell({first}).c_str(), cell({formation}).c_str(), cell(probes).c_str(),
                cell(aborts).c_str(), cell(configures).c_str());
    std::printf("  (%d clients closed in %.1f ms)\n", world, Ms(closed));
    std::fflush(stdout);
    owned.clear();
  }
  echo.Stop();
  return 0;
}

}  // namespace
}  // namespace flatshard

int main(int argc, char** argv) {
  return flatshard::bench::RunMain("fan_out_bench", [&] { return flatshard::Main(argc, argv); });
}
