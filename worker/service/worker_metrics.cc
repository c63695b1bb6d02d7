#include "worker/service/worker_metrics.h"

#include <algorithm>
#include <array>

#include "absl/strings/str_cat.h"
#include "metrics/duration_buckets.h"

#include "worker/runtime/fsdp_runtime.h"

namespace flatshard {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildHistogram;
using prometheus::Labels;

// One communicator group's series, one set per op, created up front so the
// collective path only adds to existing series.
class GroupCollectives final : public CollectiveObserver {
 public:
  GroupCollectives(const Labels& base, prometheus::Family<prometheus::Histogram>& seconds,
                   prometheus::Family<prometheus::Counter>& bytes,
                   prometheus::Family<prometheus::Counter>& bus_bytes,
                   prometheus::Family<prometheus::Counter>& failures) {
    for (int i = 0; i < kNumCollectiveOps; ++i) {
      Labels labels = base;
      labels["op"] = std::string(CollectiveOpName(static_cast<CollectiveOp>(i)));
      ops_[static_cast<size_t>(i)] = {&seconds.Add(labels, DurationBuckets()), &bytes.Add(labels),
                                      &bus_bytes.Add(labels), &failures.Add(labels)};
    }
  }

  void Record(const CollectiveSample& sample) override {
    const Series& s = ops_[static_cast<size_t>(sample.op)];
    if (!sample.ok) {
      s.failures->Increment();
      return;
    }
    s.seconds->Observe(sample.seconds);
    s.bytes->Increment(static_cast<double>(sample.bytes));
    s.bus_bytes->Increment(sample.bus_bytes);
  }

 private:
  struct Series {
    prometheus::Histogram* seconds = nullptr;
    prometheus::Counter* bytes = nullptr;
    prometheus::Counter* bus_bytes = nullptr;
    prometheus::Counter* failures = nullptr;
  };
  std::array<Series, kNumCollectiveOps> ops_;
};

}  // namespace

class WorkerMetrics::JobObserver final : public RuntimeObserver {
 public:
  JobObserver(WorkerMetrics& m, Labels labels)
      : m_(m),
        labels_(std::move(labels)),
        unshards_(m.unshards_.Add(labels_)),
        reshards_(m.reshards_.Add(labels_)),
        step_seconds_(m.step_seconds_.Add(labels_, DurationBuckets())),
        compute_seconds_(m.compute_seconds_.Add(labels_)),
        exposed_comm_seconds_(m.exposed_comm_seconds_.Add(labels_)),
        optimizer_seconds_(m.optimizer_seconds_.Add(labels_)) {
    for (const char* group : {"world", "shard", "replicate", "snapshot"}) {
      Collectives(group);
    }
  }

  CollectiveObserver* Collectives(absl::string_view group) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::unique_ptr<GroupCollectives>& g = groups_[std::string(group)];
    if (g == nullptr) {
      Labels labels = labels_;
      labels["group"] = std::string(group);
      g = std::make_unique<GroupCollectives>(labels, m_.collective_seconds_, m_.collective_bytes_,
                                             m_.collective_bus_bytes_, m_.collective_failures_);
    }
    return g.get();
  }
  void OnUnshard() override { unshards_.Increment(); }
  void OnReshard() override { reshards_.Increment(); }
  void OnStep(const StepStats& stats, double seconds) override {
    step_seconds_.Observe(seconds);
    compute_seconds_.Increment(std::max(0.0, stats.compute_seconds));
    exposed_comm_seconds_.Increment(stats.exposed_comm_seconds);
    optimizer_seconds_.Increment(stats.optimizer_seconds);
  }

 private:
  WorkerMetrics& m_;
  const Labels labels_;
  prometheus::Counter& unshards_;
  prometheus::Counter& reshards_;
  prometheus::Histogram& step_seconds_;
  prometheus::Counter& compute_seconds_;
  prometheus::Counter& exposed_comm_seconds_;
  prometheus::Counter& optimizer_seconds_;
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<GroupCollectives>> groups_;
};

WorkerMetrics::WorkerMetrics(prometheus::Registry& registry)
    : collective_seconds_(BuildHistogram()
                              .Name("flatshard_collective_duration_seconds")
                              .Help("Time one collective took on this rank, by communicator "
                                    "group and op")
                              .Register(registry)),
      collective_bytes_(BuildCounter()
                            .Name("flatshard_collective_bytes_total")
                            .Help("Collective size by the nccl-tests definition (all-gather: "
                                  "the gathered output; reduce-scatter: the scattered input; "
                                  "all-reduce, broadcast: the buffer)")
                            .Register(registry)),
      collective_bus_bytes_(BuildCounter()
                                .Name("flatshard_collective_bus_bytes_total")
                                .Help("Collective size times the op's bus factor (nccl-tests): "
                                      "its rate over the duration's is the bus bandwidth")
                                .Register(registry)),
      collective_failures_(BuildCounter()
                               .Name("flatshard_collective_failures_total")
                               .Help("Collectives that failed (peer lost, timeout, abort)")
                               .Register(registry)),
      unshards_(BuildCounter()
                    .Name("flatshard_unshards_total")
                    .Help("All-gathers issued to unshard a unit (prefetches included)")
                    .Register(registry)),
      reshards_(BuildCounter()
                    .Name("flatshard_reshards_total")
                    .Help("Units whose unsharded parameters were freed")
                    .Register(registry)),
      step_seconds_(BuildHistogram()
                        .Name("flatshard_rank_step_duration_seconds")
                        .Help("Time this rank spent running one step program (micro-steps "
                              "included), forward to optimizer")
                        .Register(registry)),
      compute_seconds_(BuildCounter()
                           .Name("flatshard_rank_compute_seconds_total")
                           .Help("Step time spent computing (forward, backward)")
                           .Register(registry)),
      exposed_comm_seconds_(BuildCounter()
                                .Name("flatshard_rank_exposed_comm_seconds_total")
                                .Help("Step time the compute lane waited for communication")
                                .Register(registry)),
      optimizer_seconds_(BuildCounter()
                             .Name("flatshard_rank_optimizer_seconds_total")
                             .Help("Step time spent in the optimizer and gradient clipping")
                             .Register(registry)) {}

WorkerMetrics::~WorkerMetrics() = default;

RuntimeObserver* WorkerMetrics::ForJob(const std::string& job_name, int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<JobObserver>& job = jobs_[{job_name, rank}];
  if (job == nullptr) {
    job = std::make_unique<JobObserver>(
        *this, Labels{{"job_name", job_name}, {"rank", absl::StrCat(rank)}});
  }
  return job.get();
}

void WorkerMetrics::AddSnapshotGauges(const WorkerSnapshot& snapshot, ScrapedGauges& gauges) {
  if (!snapshot.device_kind.empty()) {
    const DeviceMemoryStats& m = snapshot.device_memory;
    for (const auto& [state, bytes] :
         {std::pair{"pool_in_use", m.pool_in_use_bytes},
          std::pair{"pool_reserved", m.pool_reserved_bytes}, std::pair{"free", m.device_free_bytes},
          std::pair{"total", m.device_total_bytes}}) {
      if (bytes < 0) continue;  // the device cannot tell (free/total off the GPU)
      gauges.Add("flatshard_device_memory_bytes",
                 "The worker's device memory: its pool's bytes in use and reserved, and the "
                 "whole device's free and total bytes (GPUs)",
                 {{"device", snapshot.device_kind}, {"state", state}}, static_cast<double>(bytes));
    }
  }
  if (snapshot.job_name.empty()) return;
  const Labels job{{"job_name", snapshot.job_name}, {"rank", absl::StrCat(snapshot.status.rank)}};
  gauges.Add("flatshard_rank_last_completed_seq",
             "Seq of the last command batch this rank completed in its job epoch", job,
             static_cast<double>(snapshot.status.last_completed_seq));
  gauges.Add("flatshard_rank_job_epoch", "Job epoch (formation) this rank runs", job,
             static_cast<double>(snapshot.status.job_epoch));
  gauges.Add("flatshard_peer_snapshot_bytes",
             "Host bytes of in-memory peer snapshots this worker holds, its own and its ring "
             "predecessor's (checkpoints.in_memory_every_steps)",
             job, static_cast<double>(snapshot.peer_snapshot_bytes));
  for (size_t k = 0; k < snapshot.memory.size(); ++k) {
    Labels labels = job;
    labels["kind"] = std::string(MemoryKindName(static_cast<MemoryKind>(k)));
    gauges.Add("flatshard_memory_bytes", "Bytes FSDP holds on this rank, by kind", labels,
               static_cast<double>(snapshot.memory[k].current));
    gauges.Add("flatshard_memory_peak_bytes",
               "Most bytes FSDP held on this rank at once since the job was configured, by kind",
               labels, static_cast<double>(snapshot.memory[k].peak));
  }
}

}  // namespace flatshard
