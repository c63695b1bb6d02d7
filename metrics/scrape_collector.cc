#include "metrics/scrape_collector.h"

#include <utility>

namespace flatshard {

void ScrapedGauges::Add(const std::string& name, const std::string& help,
                        const prometheus::Labels& labels, double value) {
  prometheus::MetricFamily& family = families_[name];
  if (family.name.empty()) {
    family.name = name;
    family.help = help;
    family.type = prometheus::MetricType::Gauge;
  }
  prometheus::ClientMetric& metric = family.metric.emplace_back();
  for (const auto& [key, label_value] : labels) metric.label.push_back({key, label_value});
  metric.gauge.value = value;
}

std::vector<prometheus::MetricFamily> ScrapedGauges::TakeFamilies() {
  std::vector<prometheus::MetricFamily> out;
  out.reserve(families_.size());
  for (auto& [name, family] : families_) out.push_back(std::move(family));
  families_.clear();
  return out;
}

std::vector<prometheus::MetricFamily> ScrapeCollector::Collect() const {
  ScrapedGauges gauges;
  source_(gauges);
  return gauges.TakeFamilies();
}

}  // namespace flatshard
