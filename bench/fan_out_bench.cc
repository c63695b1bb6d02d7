// A failure's and a formation's fan-outs over real gRPC at scale: the
// coordinator's GrpcWorkerClients, one per worker, each with its own address
// and so its own TCP connection, to echo servers in other processes. For
// each world size, timed whole on the coordinator's one calling thread:
//   - making the clients (a channel each);
//   - the first probe (GetStatusAll), which connects every channel;
//   - probes and aborts (AbortAll) of the connected world;
//   - a formation's ConfigureAll (each call a wait-for-ready GetStatus, then
//     the Configure; the echo answers at once, so no rendezvous wait).
// The servers answer inline, and on this machine share its cores with the
// coordinator: each number is an upper bound on what the coordinator's side
// costs. A fan-out's deadline must cover the whole burst (FanOutTimeout,
// coordinator/worker_fan_out.h, is sized from these numbers).
//
//   fan_out_bench [--worlds 1024,4096,16384] [--processes 8] [--reps 5]
#include <algorithm>
#include <csignal>
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
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

#include "bench/bench_flags.h"
#include "coordinator/grpc_worker_client.h"
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

// Echo servers in processes of their own, forked before this process touches
// gRPC, each listening on `ports` loopback ports (a worker's address each).
// Each prints its ports on a pipe and serves until its stdin pipe closes (or
// this process dies).
struct EchoProcesses {
  std::vector<pid_t> pids;
  std::vector<int> keepalive;  // write ends; closing one stops its server
  std::vector<std::string> addresses;

  static EchoProcesses Start(int processes, int ports) {
    EchoProcesses p;
    for (int i = 0; i < processes; ++i) {
      int out[2], in[2];
      if (::pipe(out) != 0 || ::pipe(in) != 0) std::exit(1);
      const pid_t pid = ::fork();
      if (pid == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        ::close(out[0]);
        ::close(in[1]);
        EchoWorker service;
        grpc::ServerBuilder builder;
        std::vector<int> bound(static_cast<size_t>(ports));
        for (int& port : bound) {
          builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
        }
        builder.RegisterService(&service);
        std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
        if (server == nullptr) ::_exit(1);
        std::string line;
        for (int port : bound) absl::StrAppend(&line, port, " ");
        line.back() = '\n';
        if (::write(out[1], line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
          ::_exit(1);
        }
        char byte = 0;
        while (::read(in[0], &byte, 1) > 0) {
        }
        server->Shutdown();
        ::_exit(0);
      }
      ::close(out[1]);
      ::close(in[0]);
      std::string line;
      char c = 0;
      while (::read(out[0], &c, 1) == 1 && c != '\n') line.push_back(c);
      ::close(out[0]);
      for (absl::string_view port : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
        p.addresses.push_back(absl::StrCat("127.0.0.1:", port));
      }
      if (p.addresses.size() != static_cast<size_t>(i + 1) * static_cast<size_t>(ports)) {
        std::fprintf(stderr, "echo server %d did not start\n", i);
        std::exit(1);
      }
      p.pids.push_back(pid);
      p.keepalive.push_back(in[1]);
    }
    return p;
  }

  void Stop() {
    for (int fd : keepalive) ::close(fd);
    for (pid_t pid : pids) ::waitpid(pid, nullptr, 0);
  }
};

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

// Runs `fan_out` and returns how long it took, exiting if any call failed:
// a failed call ends early and would flatter the time.
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
};

template <typename Statuses>
Took Timed(const char* what, const std::function<Statuses()>& fan_out) {
  const absl::Duration cpu = CpuTime();
  const absl::Time start = absl::Now();
  const Statuses outcomes = fan_out();
  const Took took{absl::Now() - start, CpuTime() - cpu};
  size_t failed = 0;
  std::string first;
  for (const auto& outcome : outcomes) {
    absl::Status s;
    if constexpr (std::is_same_v<typename Statuses::value_type, absl::Status>) {
      s = outcome;
    } else {
      s = outcome.status();
    }
    if (!s.ok() && failed++ == 0) first = std::string(s.message());
  }
  if (failed > 0) {
    std::fprintf(stderr, "%s: %zu of %zu calls failed, the first: %s\n", what, failed,
                 outcomes.size(), first.c_str());
    std::exit(1);  // the echo processes die with this one (PR_SET_PDEATHSIG)
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
  CLI11_PARSE(app, argc, argv);
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
  EchoProcesses echo = EchoProcesses::Start(processes, ports);
  std::printf(
      "%d echo server processes, %d ports each; %d reps a row. Each cell: wall ms, p50 (max); "
      "the coordinator process's CPU time per worker\n\n",
      processes, ports, reps);
  std::printf(
      "| workers | make clients (ms) | first probe (connects) | probe | abort | configure "
      "|\n|---|---|---|---|---|---|\n");
  for (const int world : worlds) {
    absl::Time start = absl::Now();
    std::vector<std::unique_ptr<GrpcWorkerClient>> owned;
    std::vector<WorkerClient*> clients;
    for (int r = 0; r < world; ++r) {
      // Spread over the processes, as workers over hosts.
      const size_t process = static_cast<size_t>(r % processes);
      const size_t port = static_cast<size_t>(r / processes);
      owned.push_back(std::make_unique<GrpcWorkerClient>(
          echo.addresses[process * static_cast<size_t>(ports) + port]));
      clients.push_back(owned.back().get());
    }
    const absl::Duration make = absl::Now() - start;
    const auto deadline = [] { return absl::Now() + absl::Minutes(2); };
    using Probes = std::vector<absl::StatusOr<v1::GetStatusResponse>>;
    using Outcomes = std::vector<absl::Status>;
    const Took first =
        Timed<Probes>("first probe", [&] { return GetStatusAll(clients, deadline()); });
    std::vector<Took> probes, aborts, configures;
    for (int rep = 0; rep < reps; ++rep) {
      probes.push_back(Timed<Probes>("probe", [&] { return GetStatusAll(clients, deadline()); }));
      aborts.push_back(Timed<Outcomes>(
          "abort", [&] { return AbortAll(clients, 1, "the bench aborts", deadline()); }));
      configures.push_back(Timed<Outcomes>("configure", [&] {
        std::vector<v1::ConfigureRequest> requests(static_cast<size_t>(world));
        for (int r = 0; r < world; ++r) requests[static_cast<size_t>(r)].set_rank(r);
        return ConfigureAll(clients, std::move(requests), deadline(), {});
      }));
    }
    // The median's wall time (the slowest's), and the median's coordinator
    // CPU time per worker.
    const auto cell = [world](std::vector<Took> v) {
      std::sort(v.begin(), v.end(), [](const Took& a, const Took& b) { return a.wall < b.wall; });
      const Took& median = v[v.size() / 2];
      return absl::StrFormat("%.0f (%.0f); %.0f us", Ms(median.wall), Ms(v.back().wall),
                             absl::ToDoubleMicroseconds(median.cpu) / world);
    };
    std::printf("| %d | %.0f | %.0f; %.0f us | %s | %s | %s |\n", world, Ms(make), Ms(first.wall),
                absl::ToDoubleMicroseconds(first.cpu) / world, cell(probes).c_str(),
                cell(aborts).c_str(), cell(configures).c_str());
    std::fflush(stdout);
    start = absl::Now();
    owned.clear();
    std::printf("  (%d clients closed in %.1f ms)\n", world, Ms(absl::Now() - start));
  }
  echo.Stop();
  return 0;
}

}  // namespace
}  // namespace flatshard

int main(int argc, char** argv) {
  return flatshard::bench::RunMain("fan_out_bench", [&] { return flatshard::Main(argc, argv); });
}
