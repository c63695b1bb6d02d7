// Histogram buckets for durations, shared by every flatshard histogram so
// dashboards can aggregate across them: 10 µs (a small all-gather on
// NVLink) to 60 s (a large checkpoint), 1-2.5-5 per decade.
#ifndef FLATSHARD_METRICS_DURATION_BUCKETS_H_
#define FLATSHARD_METRICS_DURATION_BUCKETS_H_

#include "prometheus/histogram.h"

namespace flatshard {

const prometheus::Histogram::BucketBoundaries& DurationBuckets();

}  // namespace flatshard

#endif  // FLATSHARD_METRICS_DURATION_BUCKETS_H_
