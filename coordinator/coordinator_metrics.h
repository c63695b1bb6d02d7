// The coordinator's Prometheus metrics (docs/observability.md lists them):
// per job (`job_name`), steps, loss, samples/s, batch round trips and
// checkpoint saves, fed through JobObserver; and, computed when Prometheus
// scrapes, membership (workers registered and up; per rank of the job,
// whether it is up, its heartbeat age and last completed seq), the job's
// state, and the time since its last checkpoint.
#ifndef FLATSHARD_COORDINATOR_COORDINATOR_METRICS_H_
#define FLATSHARD_COORDINATOR_COORDINATOR_METRICS_H_

#include <map>
#include <mutex>
#include <string>

#include "absl/time/time.h"
#include "metrics/scrape_collector.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

#include "coordinator/job_observer.h"

namespace flatshard {

class Coordinator;

class CoordinatorMetrics final : public JobObserver {
 public:
  // Registers the families in `registry`, which must outlive this.
  explicit CoordinatorMetrics(prometheus::Registry& registry);

  void OnJobCreated(const std::string& job) override;
  void OnStep(const std::string& job, const v1::StepResult& step, int64_t samples) override;
  void OnBatch(const std::string& job, const v1::CommandBatch& batch,
               absl::Duration round_trip) override;
  void OnCheckpointSave(const std::string& job, v1::StateDictType type, absl::Duration duration,
                        const absl::StatusOr<v1::CheckpointInfo>& outcome) override;
  void OnRecovery(const std::string& job, const v1::Recovery& recovery) override;

  // The scrape-time gauges of `coordinator` as of `now`.
  void AddScrapeGauges(Coordinator& coordinator, absl::Time now, ScrapedGauges& gauges) const;

 private:
  prometheus::Family<prometheus::Counter>& steps_;
  prometheus::Family<prometheus::Histogram>& step_seconds_;
  prometheus::Family<prometheus::Counter>& samples_;
  prometheus::Family<prometheus::Gauge>& samples_per_second_;
  prometheus::Family<prometheus::Gauge>& loss_;
  prometheus::Family<prometheus::Gauge>& rank_loss_;
  prometheus::Family<prometheus::Gauge>& grad_norm_;
  prometheus::Family<prometheus::Gauge>& step_;
  prometheus::Family<prometheus::Counter>& compute_seconds_;
  prometheus::Family<prometheus::Counter>& exposed_comm_seconds_;
  prometheus::Family<prometheus::Histogram>& batch_seconds_;
  prometheus::Family<prometheus::Counter>& checkpoints_;
  prometheus::Family<prometheus::Counter>& checkpoint_failures_;
  prometheus::Family<prometheus::Counter>& checkpoint_bytes_;
  prometheus::Family<prometheus::Histogram>& checkpoint_seconds_;
  prometheus::Family<prometheus::Gauge>& checkpoint_last_success_;
  prometheus::Family<prometheus::Counter>& restarts_;
  prometheus::Family<prometheus::Histogram>& recovery_seconds_;
  prometheus::Family<prometheus::Counter>& steps_lost_;

  mutable std::mutex mu_;
  // By job: when it was created, and its last committed save (or nothing).
  std::map<std::string, absl::Time> created_;
  std::map<std::string, absl::Time> last_save_;
};

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_COORDINATOR_METRICS_H_
