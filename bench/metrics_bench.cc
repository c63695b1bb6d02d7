// What the metrics cost: the instrumentation on the collective path (an
// ObservedCommunicator feeding the worker's metrics, against the same no-op
// collective unobserved, interleaved in one run), and a scrape of a worker
// and of a coordinator with 4 and 1,024 registered workers, serialized in
// process and fetched over HTTP from the real endpoint.
//
//   metrics_bench [--calls 2000000] [--scrapes 200]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <curl/curl.h>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "metrics/build_info.h"
#include "metrics/metrics_server.h"
#include "metrics/scrape_collector.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

#include "bench/bench_flags.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_metrics.h"
#include "worker/comm/observed_communicator.h"
#include "worker/service/worker_metrics.h"

namespace flatshard {
namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Does next to nothing (counts, so the call is not optimised away): what is
// left to time is the virtual call and the instrumentation.
class NoopCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 4; }
  absl::Status AllGather(const void*, void*, size_t, DType) override {
    calls_ = calls_ + 1;
    return {};
  }
  absl::Status ReduceScatter(const void*, void*, size_t, DType) override { return {}; }
  absl::Status ReduceScatterInPlace(void*, size_t, DType) override { return {}; }
  absl::Status Gather(const void*, void*, size_t, DType, int) override { return {}; }
  absl::Status AllReduce(void*, size_t, DType, ReduceOp) override { return {}; }
  absl::Status Broadcast(void*, size_t, DType, int) override { return {}; }
  absl::Status Barrier() override { return {}; }
  absl::Status SendRecv(const void*, size_t, int, void*, size_t, int) override { return {}; }
  void Abort(const std::string&) override {}
  absl::StatusOr<std::unique_ptr<Communicator>> CreateSubgroup(const std::vector<int>&,
                                                               absl::string_view) override {
    return absl::UnimplementedError("no subgroups");
  }

 private:
  volatile int64_t calls_ = 0;
};

// Not inlined, so both communicators are called through the interface.
[[gnu::noinline]] double NanosPerAllGather(Communicator& comm, int calls) {
  float buffer[16] = {};
  const auto start = Clock::now();
  for (int i = 0; i < calls; ++i) (void)comm.AllGather(buffer, buffer, 4, DType::kFloat32);
  return std::chrono::duration<double, std::nano>(Clock::now() - start).count() / calls;
}

size_t Append(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

struct ScrapeCost {
  double serialize_us = 0;
  double http_us = 0;
  size_t bytes = 0;
};

// In-process Collect + serialize, then GET /metrics over loopback.
ScrapeCost MeasureScrape(const std::vector<std::shared_ptr<prometheus::Collectable>>& served,
                         int scrapes) {
  ScrapeCost cost;
  std::vector<double> serialize;
  for (int i = 0; i < scrapes; ++i) {
    const auto start = Clock::now();
    std::vector<prometheus::MetricFamily> families;
    for (const auto& c : served) {
      std::vector<prometheus::MetricFamily> f = c->Collect();
      families.insert(families.end(), f.begin(), f.end());
    }
    const std::string text = prometheus::TextSerializer().Serialize(families);
    serialize.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    cost.bytes = text.size();
  }
  cost.serialize_us = Median(serialize);

  absl::StatusOr<std::unique_ptr<MetricsServer>> server = MetricsServer::Start("127.0.0.1:0");
  if (!server.ok()) return cost;
  for (const auto& c : served) (*server)->Serve(c);
  const std::string url = absl::StrCat("http://", (*server)->address(), "/metrics");
  CURL* curl = curl_easy_init();
  std::string body;
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &Append);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
  std::vector<double> http;
  for (int i = 0; i < scrapes; ++i) {
    body.clear();
    const auto start = Clock::now();
    if (curl_easy_perform(curl) != CURLE_OK) break;
    http.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  curl_easy_cleanup(curl);
  if (!http.empty()) cost.http_us = Median(http);
  return cost;
}

ScrapeCost WorkerScrape(int scrapes) {
  auto registry = std::make_shared<prometheus::Registry>();
  AddBuildInfo(*registry, "worker");
  WorkerMetrics metrics(*registry);
  RuntimeObserver* job = metrics.ForJob("bench", 0);
  for (const char* group : {"world", "shard", "snapshot"}) {
    for (int op = 0; op < kNumCollectiveOps; ++op) {
      job->Collectives(group)->Record(
          {static_cast<CollectiveOp>(op), 1 << 20, 786432.0, 0.001, true});
    }
  }
  WorkerSnapshot snapshot;
  snapshot.job_name = "bench";
  snapshot.status.rank = 0;
  auto gauges = std::make_shared<ScrapeCollector>(
      [snapshot](ScrapedGauges& g) { WorkerMetrics::AddSnapshotGauges(snapshot, g); });
  return MeasureScrape({registry, gauges}, scrapes);
}

ScrapeCost CoordinatorScrape(int workers, int scrapes) {
  auto registry = std::make_shared<prometheus::Registry>();
  AddBuildInfo(*registry, "coordinator");
  CoordinatorMetrics metrics(*registry);
  Coordinator coordinator(CoordinatorOptions{});
  for (int w = 0; w < workers; ++w) {
    Registration r;
    r.worker_id = absl::StrCat("w", w);
    r.host = "h";
    r.device = "cpu";
    r.address = absl::StrCat("h:", 10000 + w);
    (void)coordinator.members().Register(r, absl::Now());
  }
  metrics.OnJobCreated("bench");
  auto gauges = std::make_shared<ScrapeCollector>(
      [&](ScrapedGauges& g) { metrics.AddScrapeGauges(coordinator, absl::Now(), g); });
  return MeasureScrape({registry, gauges}, scrapes);
}

int Main(int argc, char** argv) {
  int calls = 2000000;
  int scrapes = 200;
  CLI::App app{
      "metrics_bench: what the collective metrics add to each call, and what a Prometheus "
      "scrape of a worker and of the coordinator costs"};
  app.add_option("--calls", calls, "Collective calls, split over 7 interleaved rounds")
      ->check(CLI::Range(7, 1 << 30))
      ->capture_default_str();
  app.add_option("--scrapes", scrapes, "Scrapes timed")
      ->check(flatshard::bench::AtLeastOne())
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  prometheus::Registry registry;
  WorkerMetrics metrics(registry);
  NoopCommunicator plain;
  ObservedCommunicator observed(std::make_unique<NoopCommunicator>(),
                                metrics.ForJob("bench", 0)->Collectives("shard"));
  // Interleaved rounds, so drift on a noisy machine hits both alike.
  std::vector<double> plain_ns, observed_ns;
  for (int round = 0; round < 7; ++round) {
    plain_ns.push_back(NanosPerAllGather(plain, calls / 7));
    observed_ns.push_back(NanosPerAllGather(observed, calls / 7));
  }
  const double base = Median(plain_ns), with = Median(observed_ns);
  std::printf("| collective call (no-op all-gather) | unobserved | observed | added |\n");
  std::printf("|---|---|---|---|\n");
  std::printf("| ns per call, median of 7 rounds of %d | %.1f | %.1f | %.1f |\n\n", calls / 7, base,
              with, with - base);

  std::printf("| scrape | series bytes | collect + serialize | GET /metrics over loopback |\n");
  std::printf("|---|---|---|---|\n");
  const ScrapeCost worker = WorkerScrape(scrapes);
  std::printf("| worker (1 job, 4 groups x 5 ops) | %zu | %.0f us | %.0f us |\n", worker.bytes,
              worker.serialize_us, worker.http_us);
  for (int workers : {4, 1024}) {
    const ScrapeCost c = CoordinatorScrape(workers, scrapes);
    std::printf("| coordinator, %d workers | %zu | %.0f us | %.0f us |\n", workers, c.bytes,
                c.serialize_us, c.http_us);
  }
  return 0;
}

}  // namespace
}  // namespace flatshard

int main(int argc, char** argv) {
  return flatshard::bench::RunMain("metrics_bench", [&] { return flatshard::Main(argc, argv); });
}
