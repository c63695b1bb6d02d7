// Gauges computed when Prometheus scrapes, from state a daemon keeps anyway
// (membership and heartbeat ages, job state, memory counters): nothing copies
// that state into gauges on a timer, so a scrape never sees it stale.
#ifndef FLATSHARD_METRICS_SCRAPE_COLLECTOR_H_
#define FLATSHARD_METRICS_SCRAPE_COLLECTOR_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/labels.h"
#include "prometheus/metric_family.h"

namespace flatshard {

// The gauges of one scrape, grouped into families by name.
class ScrapedGauges {
 public:
  // `help` is taken from the first sample of a family.
  void Add(const std::string& name, const std::string& help, const prometheus::Labels& labels,
           double value);
  std::vector<prometheus::MetricFamily> TakeFamilies();

 private:
  std::map<std::string, prometheus::MetricFamily> families_;
};

class ScrapeCollector : public prometheus::Collectable {
 public:
  // `source` runs on the metrics server's thread at every scrape.
  explicit ScrapeCollector(std::function<void(ScrapedGauges&)> source)
      : source_(std::move(source)) {}

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  std::function<void(ScrapedGauges&)> source_;
};

}  // namespace flatshard

#endif  // FLATSHARD_METRICS_SCRAPE_COLLECTOR_H_
