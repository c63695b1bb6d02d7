#include "metrics/metrics_server.h"

#include <exception>
#include <vector>

#include "absl/strings/str_cat.h"

namespace flatshard {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address '", address, "' must be host:port (port 0: any free one)"));
  }
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    // One serving thread: a scrape is small and Prometheus scrapes serially.
    exposer = std::make_unique<prometheus::Exposer>(address, 1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on '", address, "': ", e.what()));
  }
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty() || ports.front() <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on '", address, "'"));
  }
  const std::string host = address.substr(0, colon);
  return std::unique_ptr<MetricsServer>(
      new MetricsServer(std::move(exposer), ports.front(), absl::StrCat(host, ":", ports.front())));
}

std::string MetricsServer::DefaultAddress(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  return absl::StrCat(colon == std::string::npos ? listen : listen.substr(0, colon), ":0");
}

void MetricsServer::Serve(std::shared_ptr<prometheus::Collectable> collectable) {
  exposer_->RegisterCollectable(collectable);
  served_.push_back(std::move(collectable));
}

}  // namespace flatshard
