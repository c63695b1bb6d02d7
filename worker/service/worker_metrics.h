// The worker daemon's Prometheus metrics (docs/observability.md lists them).
// Every series carries the job and the rank it ran as (`job_name`, `rank`),
// taken from the Configure that built the runtime, plus the collective's
// `group` and `op` or the memory `kind`: all bounded sets. Counters and
// histograms are fed by the runtime through RuntimeObserver; memory and the
// last completed seq are read from the service when Prometheus scrapes.
#ifndef FLATSHARD_WORKER_SERVICE_WORKER_METRICS_H_
#define FLATSHARD_WORKER_SERVICE_WORKER_METRICS_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "metrics/scrape_collector.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

#include "worker/runtime/runtime_observer.h"
#include "worker/service/worker_service.h"

namespace flatshard {

class WorkerMetrics {
 public:
  // Registers the families in `registry`, which must outlive this.
  explicit WorkerMetrics(prometheus::Registry& registry);
  ~WorkerMetrics();
  WorkerMetrics(const WorkerMetrics&) = delete;
  WorkerMetrics& operator=(const WorkerMetrics&) = delete;

  // The observer of the runtime that runs `job_name` as `rank`; the same
  // one each time for the same pair, so counters keep counting across
  // re-formations. Thread-safe.
  RuntimeObserver* ForJob(const std::string& job_name, int rank);

  // The scrape-time gauges of `snapshot`: memory by kind (current and
  // peak) and the last completed seq.
  static void AddSnapshotGauges(const WorkerSnapshot& snapshot, ScrapedGauges& gauges);

 private:
  class JobObserver;

  prometheus::Family<prometheus::Histogram>& collective_seconds_;
  prometheus::Family<prometheus::Counter>& collective_bytes_;
  prometheus::Family<prometheus::Counter>& collective_bus_bytes_;
  prometheus::Family<prometheus::Counter>& collective_failures_;
  prometheus::Family<prometheus::Counter>& unshards_;
  prometheus::Family<prometheus::Counter>& reshards_;
  prometheus::Family<prometheus::Histogram>& step_seconds_;
  prometheus::Family<prometheus::Counter>& compute_seconds_;
  prometheus::Family<prometheus::Counter>& exposed_comm_seconds_;
  prometheus::Family<prometheus::Counter>& optimizer_seconds_;

  std::mutex mu_;
  std::map<std::pair<std::string, int>, std::unique_ptr<JobObserver>> jobs_;
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_SERVICE_WORKER_METRICS_H_
