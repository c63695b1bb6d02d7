// The metrics' logic: what the communicator wrapper reports (nccl-tests
// sizes and bus factors), what the worker's and the coordinator's metrics
// export for the events they are told of, scrape-time gauges, and the
// /metrics endpoint itself (a real HTTP server on a free port). The
// daemons' /metrics under training are checked by
// tests/observability/metrics_naming_test.py.
#include <memory>
#include <string>
#include <vector>

#include <curl/curl.h>

#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "metrics/build_info.h"
#include "metrics/metrics_server.h"
#include "metrics/scrape_collector.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

#include "coordinator/coordinator_metrics.h"
#include "worker/comm/observed_communicator.h"
#include "worker/runtime/fsdp_runtime.h"
#include "worker/service/worker_metrics.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Text(const prometheus::Collectable& collectable) {
  return prometheus::TextSerializer().Serialize(collectable.Collect());
}

// Succeeds or fails every call as told; counts them.
class FakeCommunicator final : public Communicator {
 public:
  explicit FakeCommunicator(int size) : size_(size) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  absl::Status AllGather(const void*, void*, size_t, DType) override { return Next(); }
  absl::Status ReduceScatter(const void*, void*, size_t, DType) override { return Next(); }
  absl::Status ReduceScatterInPlace(void*, size_t, DType) override { return Next(); }
  absl::Status Gather(const void*, void*, size_t, DType, int) override { return Next(); }
  absl::Status AllReduce(void*, size_t, DType, ReduceOp) override { return Next(); }
  absl::Status Broadcast(void*, size_t, DType, int) override { return Next(); }
  absl::Status Barrier() override { return Next(); }
  absl::Status SendRecv(const void*, size_t, int, void*, size_t, int) override { return Next(); }
  void Abort(const std::string&) override {}
  absl::StatusOr<std::unique_ptr<Communicator>> CreateSubgroup(const std::vector<int>& ranks,
                                                               absl::string_view) override {
    return std::make_unique<FakeCommunicator>(static_cast<int>(ranks.size()));
  }
  absl::Status next = absl::OkStatus();
  int calls = 0;

 private:
  absl::Status Next() {
    ++calls;
    return next;
  }
  int size_;
};

class RecordingObserver final : public CollectiveObserver {
 public:
  void Record(const CollectiveSample& sample) override { samples.push_back(sample); }
  std::vector<CollectiveSample> samples;
};

TEST(ObservedCommunicatorTest, ReportsNcclTestsSizesAndBusFactors) {
  RecordingObserver observer;
  auto fake = std::make_unique<FakeCommunicator>(4);
  FakeCommunicator* inner = fake.get();
  ObservedCommunicator comm(std::move(fake), &observer);
  float buffer[64] = {};
  ASSERT_TRUE(comm.AllGather(buffer, buffer, 8, DType::kFloat32).ok());
  ASSERT_TRUE(comm.ReduceScatter(buffer, buffer, 8, DType::kBFloat16).ok());
  ASSERT_TRUE(comm.AllReduce(buffer, 10, DType::kFloat32, ReduceOp::kSum).ok());
  ASSERT_TRUE(comm.Broadcast(buffer, 10, DType::kFloat32, 0).ok());
  ASSERT_TRUE(comm.Barrier().ok());
  inner->next = absl::UnavailableError("peer gone");
  EXPECT_EQ(comm.AllReduce(buffer, 1, DType::kFloat32, ReduceOp::kSum).code(),
            absl::StatusCode::kUnavailable);

  ASSERT_EQ(observer.samples.size(), 6u);
  EXPECT_EQ(inner->calls, 6);
  // all-gather: the gathered output, 8 floats from each of 4 ranks; (n-1)/n.
  EXPECT_EQ(observer.samples[0].op, CollectiveOp::kAllGather);
  EXPECT_EQ(observer.samples[0].bytes, 8 * 4 * 4);
  EXPECT_DOUBLE_EQ(observer.samples[0].bus_bytes, 8 * 4 * 4 * 0.75);
  // reduce-scatter: the scattered input, 8 bf16 per rank times 4; (n-1)/n.
  EXPECT_EQ(observer.samples[1].op, CollectiveOp::kReduceScatter);
  EXPECT_EQ(observer.samples[1].bytes, 8 * 2 * 4);
  EXPECT_DOUBLE_EQ(observer.samples[1].bus_bytes, 8 * 2 * 4 * 0.75);
  // all-reduce: the buffer; 2(n-1)/n.
  EXPECT_EQ(observer.samples[2].bytes, 40);
  EXPECT_DOUBLE_EQ(observer.samples[2].bus_bytes, 40 * 1.5);
  // broadcast: the buffer; 1.
  EXPECT_EQ(observer.samples[3].bytes, 40);
  EXPECT_DOUBLE_EQ(observer.samples[3].bus_bytes, 40);
  EXPECT_EQ(observer.samples[4].op, CollectiveOp::kBarrier);
  EXPECT_EQ(observer.samples[4].bytes, 0);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(observer.samples[static_cast<size_t>(i)].ok);
  EXPECT_FALSE(observer.samples[5].ok);

  // A subgroup comes back unobserved: its caller wraps it under its own group.
  absl::StatusOr<std::unique_ptr<Communicator>> sub = comm.CreateSubgroup({0, 1}, "shard0");
  ASSERT_TRUE(sub.ok());
  ASSERT_TRUE((*sub)->Barrier().ok());
  EXPECT_EQ(observer.samples.size(), 6u);
  EXPECT_EQ(Observe(nullptr, &observer), nullptr);

  // The in-place reduce-scatter counts as the out-of-place one does.
  inner->next = absl::OkStatus();
  ASSERT_TRUE(comm.ReduceScatterInPlace(buffer, 8, DType::kFloat32).ok());
  ASSERT_EQ(observer.samples.size(), 7u);
  EXPECT_EQ(observer.samples[6].op, CollectiveOp::kReduceScatter);
  EXPECT_EQ(observer.samples[6].bytes, 8 * 4 * 4);
  EXPECT_DOUBLE_EQ(observer.samples[6].bus_bytes, 8 * 4 * 4 * 0.75);
}

TEST(WorkerMetricsTest, ExportsCollectivesStepsAndMemoryByJobAndRank) {
  prometheus::Registry registry;
  WorkerMetrics metrics(registry);
  RuntimeObserver* job = metrics.ForJob("demo", 3);
  EXPECT_EQ(metrics.ForJob("demo", 3), job);
  EXPECT_NE(metrics.ForJob("demo", 1), job);

  job->Collectives("shard")->Record({CollectiveOp::kAllGather, 1000, 750.0, 0.002, true});
  job->Collectives("shard")->Record({CollectiveOp::kAllGather, 1000, 750.0, 0.004, true});
  job->Collectives("world")->Record({CollectiveOp::kAllReduce, 8, 12.0, 1.0, false});
  job->OnUnshard();
  job->OnUnshard();
  job->OnReshard();
  StepStats stats;
  stats.loss = 0.5;
  stats.compute_seconds = 0.3;
  stats.exposed_comm_seconds = 0.1;
  job->OnStep(stats, 0.5);

  const std::string text = Text(registry);
  const std::string shard = R"(job_name="demo",op="all_gather",rank="3"})";
  EXPECT_THAT(text,
              HasSubstr(R"(flatshard_collective_bytes_total{group="shard",)" + shard + " 2000"));
  EXPECT_THAT(
      text, HasSubstr(R"(flatshard_collective_bus_bytes_total{group="shard",)" + shard + " 1500"));
  EXPECT_THAT(text, HasSubstr(R"(flatshard_collective_duration_seconds_count{group="shard",)" +
                              shard + " 2"));
  // 2 ms and 4 ms: both in the 5 ms bucket, neither in 1 ms.
  EXPECT_THAT(text,
              HasSubstr(R"(group="shard",job_name="demo",op="all_gather",rank="3",le="0.005"} 2)"));
  EXPECT_THAT(text,
              HasSubstr(R"(group="shard",job_name="demo",op="all_gather",rank="3",le="0.001"} 0)"));
  // A failed collective counts as a failure, not as traffic.
  EXPECT_THAT(
      text,
      HasSubstr(
          R"(flatshard_collective_failures_total{group="world",job_name="demo",op="all_reduce",rank="3"} 1)"));
  EXPECT_THAT(
      text,
      HasSubstr(
          R"(flatshard_collective_bytes_total{group="world",job_name="demo",op="all_reduce",rank="3"} 0)"));
  EXPECT_THAT(text, HasSubstr(R"(flatshard_unshards_total{job_name="demo",rank="3"} 2)"));
  EXPECT_THAT(text, HasSubstr(R"(flatshard_reshards_total{job_name="demo",rank="3"} 1)"));
  EXPECT_THAT(
      text, HasSubstr(R"(flatshard_rank_step_duration_seconds_sum{job_name="demo",rank="3"} 0.5)"));
  // Every group exists from the start, so dashboards have series at zero.
  EXPECT_THAT(text, HasSubstr(R"(flatshard_collective_bytes_total{group="replicate",)"));

  WorkerSnapshot snapshot;
  ScrapedGauges none;
  WorkerMetrics::AddSnapshotGauges(snapshot, none);
  EXPECT_TRUE(none.TakeFamilies().empty()) << "no job, no per-job gauges";
  snapshot.job_name = "demo";
  snapshot.status.rank = 3;
  snapshot.status.last_completed_seq = 42;
  snapshot.memory[static_cast<size_t>(MemoryKind::kUnshardedParams)] = {4096, 8192};
  snapshot.peer_snapshot_bytes = 3000;
  ScrapedGauges gauges;
  WorkerMetrics::AddSnapshotGauges(snapshot, gauges);
  const std::string scraped = Text(
      ScrapeCollector([&](ScrapedGauges& g) { WorkerMetrics::AddSnapshotGauges(snapshot, g); }));
  EXPECT_THAT(scraped,
              HasSubstr(R"(flatshard_rank_last_completed_seq{job_name="demo",rank="3"} 42)"));
  EXPECT_THAT(
      scraped,
      HasSubstr(
          R"(flatshard_memory_bytes{job_name="demo",kind="unsharded_params",rank="3"} 4096)"));
  EXPECT_THAT(
      scraped,
      HasSubstr(
          R"(flatshard_memory_peak_bytes{job_name="demo",kind="unsharded_params",rank="3"} 8192)"));
  EXPECT_THAT(scraped,
              HasSubstr(R"(flatshard_peer_snapshot_bytes{job_name="demo",rank="3"} 3000)"));
  EXPECT_THAT(scraped, HasSubstr("# HELP flatshard_memory_bytes "));
  EXPECT_THAT(scraped, HasSubstr("# TYPE flatshard_memory_bytes gauge"));
  EXPECT_THAT(scraped, Not(HasSubstr("flatshard_device_memory_bytes"))) << "no device, no series";

  // A worker with a device reports its pool, and the whole device where it can
  // tell (a GPU); a state the device cannot tell (-1) has no series at all.
  snapshot.device_kind = "cuda";
  snapshot.device_memory.pool_in_use_bytes = 1 << 20;
  snapshot.device_memory.pool_reserved_bytes = 1 << 21;
  snapshot.device_memory.device_free_bytes = -1;
  snapshot.device_memory.device_total_bytes = int64_t{80} << 30;
  const std::string with_device = Text(
      ScrapeCollector([&](ScrapedGauges& g) { WorkerMetrics::AddSnapshotGauges(snapshot, g); }));
  EXPECT_THAT(
      with_device,
      HasSubstr(R"(flatshard_device_memory_bytes{device="cuda",state="pool_in_use"} 1048576)"));
  EXPECT_THAT(
      with_device,
      HasSubstr(R"(flatshard_device_memory_bytes{device="cuda",state="pool_reserved"} 2097152)"));
  EXPECT_THAT(
      with_device,
      HasSubstr(R"(flatshard_device_memory_bytes{device="cuda",state="total"} 85899345920)"));
  EXPECT_THAT(with_device, Not(HasSubstr(R"(state="free")")));
}

TEST(CoordinatorMetricsTest, ExportsStepsBatchesAndCheckpointOutcomes) {
  prometheus::Registry registry;
  CoordinatorMetrics metrics(registry);
  metrics.OnJobCreated("demo");
  std::string text = Text(registry);
  // Before anything happened, every series a dashboard or alert reads is 0.
  EXPECT_THAT(
      text, HasSubstr(R"(flatshard_checkpoint_failures_total{job_name="demo",type="sharded"} 0)"));
  EXPECT_THAT(text, HasSubstr(R"(flatshard_steps_total{job_name="demo"} 0)"));
  EXPECT_THAT(text, Not(HasSubstr("flatshard_checkpoint_last_success_timestamp_seconds{")));

  v1::StepResult step;
  step.set_step(7);
  step.set_loss(0.25);
  step.set_step_seconds(0.2);
  step.set_samples_per_second(640);
  step.add_rank_losses(0.2);
  step.add_rank_losses(0.3);
  metrics.OnStep("demo", step, 128);
  v1::CommandBatch batch;
  batch.mutable_step()->set_sync_gradients(true);
  metrics.OnBatch("demo", batch, absl::Milliseconds(3));
  // The label is the batch's kind, no_sync micro-steps apart.
  batch.mutable_step()->set_sync_gradients(false);
  metrics.OnBatch("demo", batch, absl::Milliseconds(3));
  batch.mutable_checkpoint()->mutable_save_shard();
  metrics.OnBatch("demo", batch, absl::Milliseconds(3));
  v1::CheckpointInfo info;
  info.set_bytes(1 << 20);
  metrics.OnCheckpointSave("demo", v1::SHARDED_STATE_DICT, absl::Seconds(2), info);
  metrics.OnCheckpointSave("demo", v1::STATE_DICT_TYPE_UNSPECIFIED, absl::Seconds(1),
                           absl::UnavailableError("disk full"));
  text = Text(registry);
  EXPECT_THAT(text, HasSubstr(R"(flatshard_steps_total{job_name="demo"} 1)"));
  EXPECT_THAT(text, HasSubstr(R"(flatshard_samples_total{job_name="demo"} 128)"));
  EXPECT_THAT(text, HasSubstr(R"(flatshard_job_step{job_name="demo"} 7)"));
  EXPECT_THAT(text, HasSubstr(R"(flatshard_loss{job_name="demo"} 0.25)"));
  EXPECT_THAT(text, HasSubstr(R"(flatshard_rank_loss{job_name="demo",rank="1"} 0.3)"));
  EXPECT_THAT(
      text,
      HasSubstr(R"(flatshard_batch_round_trip_seconds_count{job_name="demo",kind="step"} 1)"));
  EXPECT_THAT(text, HasSubstr(R"(flatshard_batch_round_trip_seconds_count{job_name="demo",)"
                              R"(kind="micro_step"} 1)"));
  EXPECT_THAT(text, HasSubstr(R"(flatshard_batch_round_trip_seconds_count{job_name="demo",)"
                              R"(kind="checkpoint"} 1)"));
  EXPECT_THAT(text, HasSubstr(R"(flatshard_checkpoints_total{job_name="demo",type="sharded"} 1)"));
  EXPECT_THAT(
      text,
      HasSubstr(R"(flatshard_checkpoint_bytes_total{job_name="demo",type="sharded"} 1048576)"));
  EXPECT_THAT(
      text,
      HasSubstr(R"(flatshard_checkpoint_duration_seconds_sum{job_name="demo",type="sharded"} 2)"));
  // An unspecified type is FULL (docs/fsdp-semantics.md §5); a failure commits nothing.
  EXPECT_THAT(text,
              HasSubstr(R"(flatshard_checkpoint_failures_total{job_name="demo",type="full"} 1)"));
  EXPECT_THAT(text, HasSubstr(R"(flatshard_checkpoints_total{job_name="demo",type="full"} 0)"));
  EXPECT_THAT(text,
              HasSubstr("flatshard_checkpoint_last_success_timestamp_seconds{job_name=\"demo\"}"));
}

TEST(ScrapedGaugesTest, GroupsSamplesIntoFamiliesByName) {
  ScrapedGauges gauges;
  gauges.Add("flatshard_a", "first help", {{"rank", "0"}}, 1);
  gauges.Add("flatshard_b", "b help", {}, 2);
  gauges.Add("flatshard_a", "ignored", {{"rank", "1"}}, 3);
  std::vector<prometheus::MetricFamily> families = gauges.TakeFamilies();
  ASSERT_EQ(families.size(), 2u);
  EXPECT_EQ(families[0].name, "flatshard_a");
  EXPECT_EQ(families[0].help, "first help");
  ASSERT_EQ(families[0].metric.size(), 2u);
  EXPECT_EQ(families[0].metric[1].gauge.value, 3);
  EXPECT_TRUE(gauges.TakeFamilies().empty());
}

size_t Append(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

// GET http://address/metrics over a real socket.
std::string Scrape(const std::string& address) {
  std::string body;
  CURL* curl = curl_easy_init();
  const std::string url = "http://" + address + "/metrics";
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &Append);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, 10000L);
  const CURLcode code = curl_easy_perform(curl);
  curl_easy_cleanup(curl);
  EXPECT_EQ(code, CURLE_OK) << curl_easy_strerror(code);
  return body;
}

TEST(MetricsServerTest, ServesRegistryAndScrapeGaugesOnAPickedPort) {
  absl::StatusOr<std::unique_ptr<MetricsServer>> server = MetricsServer::Start("127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_GT((*server)->port(), 0);
  EXPECT_EQ((*server)->address(), "127.0.0.1:" + std::to_string((*server)->port()));
  auto registry = std::make_shared<prometheus::Registry>();
  AddBuildInfo(*registry, "worker");
  int scrapes = 0;
  (*server)->Serve(registry);
  (*server)->Serve(std::make_shared<ScrapeCollector>([&scrapes](ScrapedGauges& g) {
    g.Add("flatshard_test_scrapes", "Scrapes so far", {}, ++scrapes);
  }));
  std::string body = Scrape((*server)->address());
  EXPECT_THAT(body, HasSubstr("component=\"worker\""));
  EXPECT_THAT(body, HasSubstr("# TYPE flatshard_build_info gauge"));
  EXPECT_THAT(body, HasSubstr("flatshard_test_scrapes 1"));
  body = Scrape((*server)->address());
  EXPECT_THAT(body, HasSubstr("flatshard_test_scrapes 2")) << "computed at every scrape";

  // The port is taken: a clear error, not an exception.
  absl::StatusOr<std::unique_ptr<MetricsServer>> taken = MetricsServer::Start((*server)->address());
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(taken.status().message(), HasSubstr((*server)->address()));
  EXPECT_EQ(MetricsServer::Start("no-port").status().code(), absl::StatusCode::kInvalidArgument);
}

// Every daemon's exit stops its metrics server: civetweb alone waits up to
// 2 s for its master thread's poll to return (metrics_server.cc), which
// made each daemon's stop, and a local cluster's, seconds long.
TEST(MetricsServerTest, StopsWithoutWaitingOutCivetwebsPoll) {
  for (const std::string address : {"127.0.0.1:0", "0.0.0.0:0"}) {
    absl::StatusOr<std::unique_ptr<MetricsServer>> server = MetricsServer::Start(address);
    ASSERT_TRUE(server.ok()) << server.status();
    (*server)->Serve(std::make_shared<prometheus::Registry>());
    const std::string reach =
        absl::StrReplaceAll((*server)->address(), {{"0.0.0.0:", "127.0.0.1:"}});
    Scrape(reach);  // it serves (Scrape checks the request succeeded)
    const absl::Time start = absl::Now();
    server->reset();
    EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << address;
  }
}

}  // namespace
}  // namespace flatshard
