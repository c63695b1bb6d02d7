// A daemon's /metrics endpoint: prometheus-cpp's Exposer on an address (port
// 0 picks a free one and reports it), serving a registry plus any scrape-time
// collectors. Bind failures come back as a Status, not an exception.
#ifndef FLATSHARD_METRICS_METRICS_SERVER_H_
#define FLATSHARD_METRICS_METRICS_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"

namespace flatshard {

class MetricsServer {
 public:
  // `address` like "127.0.0.1:0" or "0.0.0.0:9400".
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& address);
  // Stops serving, in milliseconds rather than civetweb's 2 s (see .cc).
  ~MetricsServer();

  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Serves `collectable` at /metrics from now on (and keeps it alive: the
  // Exposer itself only holds a weak reference).
  void Serve(std::shared_ptr<prometheus::Collectable> collectable);

  // The default metrics address of a daemon serving gRPC on `listen`: the
  // same host (so a daemon reachable from other hosts is scraped from them
  // too), any free port.
  static std::string DefaultAddress(const std::string& listen);

  int port() const { return port_; }
  // host:port as a scraper reaches it ("0.0.0.0" stays as given).
  const std::string& address() const { return address_; }

 private:
  MetricsServer(std::unique_ptr<prometheus::Exposer> exposer, int port, std::string address)
      : exposer_(std::move(exposer)), port_(port), address_(std::move(address)) {}

  std::vector<std::shared_ptr<prometheus::Collectable>> served_;
  // Declared after what it serves: destroyed (stopped) first.
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_;
  std::string address_;
};

}  // namespace flatshard

#endif  // FLATSHARD_METRICS_METRICS_SERVER_H_
