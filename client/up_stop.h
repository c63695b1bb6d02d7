// How `flatshard up` stops: first, on a stop signal, a save of each job whose
// state a restart would not restore (the workers hold the only copy of it;
// client/save_before_stop.h), on a thread of its own so that a second
// Ctrl-C is heard; then its daemons, the coordinator first, killed at once
// on one more Ctrl-C rather than after their grace.
#ifndef FLATSHARD_CLIENT_UP_STOP_H_
#define FLATSHARD_CLIENT_UP_STOP_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/time/time.h"

#include "client/flatshard_client.h"
#include "client/local_cluster.h"
#include "client/local_prometheus.h"

namespace flatshard {

// One line of `up`'s output; called from more than one thread.
using SayLine = std::function<void(const std::string&)>;

// Stops Prometheus (may be null) and the cluster (the coordinator first);
// one more stop signal meanwhile kills them all rather than wait out their
// grace. kExitOk when every daemon exited cleanly, else kExitFailed.
int StopCluster(LocalPrometheus* prometheus, LocalCluster& cluster, const SayLine& say);

// The save before stopping, shared between its thread and the one waiting
// for it (which may stop waiting first).
struct StopSave {
  enum Phase { kListing, kSaving, kDone };
  std::atomic<int> phase{kListing};
  std::atomic<bool> kept{false};  // at kDone: every job saved, or none needed it
  std::thread thread;             // joined after the cluster stops
  // Whether the job's state is kept: a save given up on may still have
  // finished before the coordinator stopped.
  bool Kept() const { return phase.load() == kDone && kept.load(); }
};

// Saves what the workers alone hold on a thread of its own, while this one
// listens for a second stop signal; returns when the save is done, that
// signal came or `timeout` passed. A save given up on ends with the
// coordinator, so its thread is joined after the cluster stops. `say` is
// called from both threads.
std::unique_ptr<StopSave> SaveBeforeStop(const CoordinatorTarget& target, absl::Duration timeout,
                                         const SayLine& say);

}  // namespace flatshard

#endif  // FLATSHARD_CLIENT_UP_STOP_H_
