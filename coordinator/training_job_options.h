// How a TrainingJob reaches the rest of the coordinator: its timeouts, its
// workers' clients, the checkpoint root, the metrics, the membership a
// recovery draws from, the rendezvous store and the state store.
#ifndef FLATSHARD_COORDINATOR_TRAINING_JOB_OPTIONS_H_
#define FLATSHARD_COORDINATOR_TRAINING_JOB_OPTIONS_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"

#include "coordinator/command_sequencer.h"
#include "coordinator/job_observer.h"
#include "coordinator/kv_store.h"
#include "coordinator/membership.h"
#include "coordinator/state_store.h"
#include "coordinator/worker_client.h"

namespace flatshard {

// A client for `worker`, one of `world_size` ranks: its channel must stay
// connected through a fan-out to all of them (WorkerChannelIdle).
using WorkerConnector =
    std::function<std::unique_ptr<WorkerClient>(const WorkerRecord& worker, size_t world_size)>;

struct TrainingJobOptions {
  absl::Duration configure_timeout = absl::Minutes(2);
  // Each batch's end-to-end timeout and its stall timeout (--batch-timeout,
  // --stall-timeout).
  BatchLimits batch;
  WorkerConnector connect;
  // Checkpoints live in <checkpoint_root>/<job>/, which the workers reach as
  // their --checkpoint-dir (a shared directory).
  std::string checkpoint_root = "./checkpoints";
  // Metrics: steps, batch round trips, checkpoint saves. Must outlive the job.
  JobObserver* observer = nullptr;
  // Recovery: the registered workers heartbeating within the timeout (the
  // coordinator's membership), and how long a worker may take to answer the
  // liveness probe after a failure.
  std::function<std::vector<WorkerRecord>()> live_workers;
  std::function<void(const WorkerRecord& probed)> mark_unreachable;
  // The rendezvous store the workers' Configure meets in: a formed epoch
  // deletes its predecessor's keys, a failed formation abandons its own so the
  // ranks still waiting there are released at once. Null: neither. Must
  // outlive the job.
  KvStore* rendezvous = nullptr;
  absl::Duration probe_timeout = absl::Seconds(2);
  // A registered worker by id, live or not (a restarted coordinator's
  // membership); unset or nullopt: unknown.
  std::function<std::optional<WorkerRecord>(const std::string& worker_id)> find_worker;
  // Where the job keeps its state across coordinator restarts; null: memory
  // only. Must outlive the job.
  StateStore* state = nullptr;
  // With a state store: a training step's batch is journaled while the
  // batch before it runs (TrainingJob::JournalAhead), not on the step's
  // path. Off only to measure what that saves (control_plane_bench).
  bool journal_ahead = true;
  // The wall clock that stamps saves (created_unix_micros) and starts a
  // loaded history; null: absl::Now. Only tests set it, to step it back.
  std::function<absl::Time()> checkpoint_clock;
};

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_TRAINING_JOB_OPTIONS_H_
