// A job's lifecycle (docs/architecture.md §4):
//
//   PENDING -> FORMING -> READY -> TRAINING <-> IDLE
//      READY | TRAINING | IDLE -> RECOVERING -> FORMING (a rank failed and the
//                                              job's recovery policy allows it)
//      RECOVERING -> READY | RECOVERING      (a restarted coordinator re-adopts
//                                              the workers, or rolls back)
//      any state but STOPPED -> FAILED -> FORMING (re-form) | STOPPED
//      any state -> STOPPED
//
// Every transition is an event with a message, kept in order so WatchEvents
// can replay them and then wait for more. An illegal transition is refused
// (FAILED_PRECONDITION) rather than silently applied. A transition is
// recorded (the observer: the job persists itself) before anyone can see it,
// so a state a client saw survives a crash of the coordinator right after.
// Thread-safe; transitions are serialized.
#ifndef FLATSHARD_COORDINATOR_JOB_STATE_MACHINE_H_
#define FLATSHARD_COORDINATOR_JOB_STATE_MACHINE_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

#include "flatshard/v1/job.pb.h"

namespace flatshard {

struct JobEventRecord {
  v1::JobState state = v1::PENDING;
  std::string message;
  absl::Time time;
};

class JobStateMachine {
 public:
  explicit JobStateMachine(std::string job_name);

  v1::JobState state() const;
  // The message of the last FAILED transition ("" if never failed).
  std::string failure() const;

  // What a record of the job holds: the state and failure of a transition
  // being recorded (the observer runs before the state is visible), else
  // the current ones. For the job's Persist, whoever calls it.
  struct Recorded {
    v1::JobState state = v1::PENDING;
    std::string failure;
  };
  Recorded ForRecord() const;

  absl::Status Transition(v1::JobState to, const std::string& message);
  // Moves to `to` only if the state is `from`; FAILED_PRECONDITION otherwise,
  // naming the state it is in. What lets two callers race for an operation.
  absl::Status TransitionFrom(v1::JobState from, v1::JobState to, const std::string& message);

  // Events from index `next` on; waits until there is one, the machine is
  // closed, or `deadline` passes. Returns what it has (maybe nothing), and
  // sets `*closed` (if given) in the same look: closed with nothing
  // returned means every event a watcher may see was seen.
  std::vector<JobEventRecord> EventsFrom(size_t next, absl::Time deadline,
                                         bool* closed = nullptr) const;
  // Wakes every waiter for good: the job was deleted (`end` OK, after its
  // STOPPED event) or the coordinator is shutting down (`end` UNAVAILABLE,
  // before it stops the job in memory). Events after the first Close are
  // kept (the job's state) but never handed to a watcher: a shutdown's
  // STOPPED would read as a deletion. A second Close changes nothing.
  void Close(absl::Status end = absl::OkStatus());
  bool closed() const;
  // How a watch that saw every event ends: Close's `end`.
  absl::Status end() const;

  static bool Allowed(v1::JobState from, v1::JobState to);

  // A restarted coordinator puts the job back in the state its state store
  // holds; the event saying so starts the job's history (no transition
  // check: nothing came before in this process).
  void Restore(v1::JobState state, const std::string& failure, const std::string& message);
  // Called for every transition before it is visible, outside the state's
  // lock (the job persists itself, reading ForRecord()).
  void set_on_transition(std::function<void()> observer);

 private:
  // Transition and TransitionFrom (`from` unset: any state).
  absl::Status TransitionChecked(std::optional<v1::JobState> from, v1::JobState to,
                                 const std::string& message);
  absl::Status CheckLocked(std::optional<v1::JobState> from, v1::JobState to) const;

  const std::string job_name_;
  // One transition at a time, from its check to its publication: a record
  // written for one must not be overtaken by another's.
  std::mutex transition_mu_;
  mutable std::mutex mu_;
  mutable std::condition_variable changed_;
  v1::JobState state_ = v1::PENDING;
  std::string failure_;
  std::vector<JobEventRecord> events_;
  bool closed_ = false;
  size_t watchable_ = 0;  // events_ a watcher sees once closed
  absl::Status end_;
  std::function<void()> on_transition_;
  std::optional<Recorded> recording_;  // the transition being recorded
};

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_JOB_STATE_MACHINE_H_
