#include "metrics/duration_buckets.h"

namespace flatshard {

const prometheus::Histogram::BucketBoundaries& DurationBuckets() {
  static const auto* const kBuckets = new prometheus::Histogram::BucketBoundaries{
      10e-6, 25e-6,  50e-6,  100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3,
      50e-3, 100e-3, 250e-3, 500e-3, 1.0,    2.5,    5.0,  10.0,   20.0, 30.0,  60.0};
  return *kBuckets;
}

}  // namespace flatshard
