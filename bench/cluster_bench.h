// What the benchmarks that train on a real local cluster share: the median of
// a sample, and the step times a client observes.
#ifndef FLATSHARD_BENCH_CLUSTER_BENCH_H_
#define FLATSHARD_BENCH_CLUSTER_BENCH_H_

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/time/clock.h"

#include "client/flatshard_client.h"

namespace flatshard {

inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Step times (seconds) of `steps` steps, the first 3 left out (warm-up): the
// wall time between two step results reaching this client, so everything the
// coordinator does per step counts. A failed training is reported on stderr
// and ends the sample.
inline std::vector<double> StepTimes(FlatshardClient& client, const std::string& job, int steps) {
  std::vector<double> times;
  absl::Time last = absl::Now();
  const absl::Status trained = client.Train(job, steps, 0, [&](const v1::StepResult& r) {
    const absl::Time now = absl::Now();
    if (r.step() > 3) times.push_back(absl::ToDoubleSeconds(now - last));
    last = now;
  });
  if (!trained.ok()) std::fprintf(stderr, "train: %s\n", trained.ToString().c_str());
  return times;
}

}  // namespace flatshard

#endif  // FLATSHARD_BENCH_CLUSTER_BENCH_H_
