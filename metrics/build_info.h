// flatshard_build_info{component,version,revision,compiler,cuda} 1: which build
// a daemon runs, for dashboards to show and to join against.
#ifndef FLATSHARD_METRICS_BUILD_INFO_H_
#define FLATSHARD_METRICS_BUILD_INFO_H_

#include <string>

#include "prometheus/registry.h"

namespace flatshard {

// `component`: "coordinator" or "worker".
void AddBuildInfo(prometheus::Registry& registry, const std::string& component);

// "0.1.0 (abc1234)".
std::string BuildVersion();

}  // namespace flatshard

#endif  // FLATSHARD_METRICS_BUILD_INFO_H_
