// Every flatshard program runs absl::Mutex as a release build of Abseil does:
// without its deadlock detector.
//
// Debian compiles its Abseil without NDEBUG, and Abseil decides the
// detector's default when it is compiled, so the detector is on in every
// program that links it, gRPC's mutexes included. On each Lock it finds the
// mutex's node in one process-wide graph, under one process-wide spin lock,
// in a pointer map of a fixed 8,171 chains, and records an edge from every
// lock the thread holds. A coordinator holding 16,384 worker channels has
// hundreds of thousands of mutexes, so the chains grow long: that lookup was
// a quarter of the coordinator's CPU, and a probe of every worker cost
// 2.9x the time it takes without it (bench/RESULTS.md, "Abseil's deadlock
// detector at 16,384 channels").
//
// Test programs (tests/test_main.cc) keep Abseil's default, so the lock
// orders the tests exercise are still checked.
#ifndef FLATSHARD_RPC_MUTEX_DEADLOCK_DETECTION_H_
#define FLATSHARD_RPC_MUTEX_DEADLOCK_DETECTION_H_

#include "absl/synchronization/mutex.h"

namespace flatshard {

// Call first in main(), before any thread starts.
inline void TurnOffMutexDeadlockDetection() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace flatshard

#endif  // FLATSHARD_RPC_MUTEX_DEADLOCK_DETECTION_H_
