// One training operation on the coordinator (docs/fault-tolerance.md,
// "Training outlives its client"): what it was asked to do, the step results
// it has produced, how it ended. The thread running it publishes; any number
// of clients stream from it (the one that started it, and later ones that
// attach), each at its own pace. It keeps the last kKeptResults results: a
// client that falls further behind skips ahead rather than hold memory.
// Thread-safe.
#ifndef FLATSHARD_COORDINATOR_TRAINING_RUN_H_
#define FLATSHARD_COORDINATOR_TRAINING_RUN_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

#include "flatshard/v1/job.pb.h"

namespace flatshard {

class TrainingRun {
 public:
  static constexpr size_t kKeptResults = 1024;

  explicit TrainingRun(v1::TrainingOperation operation);

  // The operation as it stands (running, stop requested, outcome).
  v1::TrainingOperation operation() const;

  // The runner: the job took the operation slot and is TRAINING; a step
  // finished; the operation ended (OK: it reached its target or was
  // stopped), as the job shows it: MarkEnded before the job goes IDLE, so
  // whoever sees IDLE sees the outcome; Finish once the operation slot is
  // free, which ends the streams, so a client's next call finds the job free.
  // The first status and outcome given count.
  void MarkStarted();
  void Publish(const v1::StepResult& result);
  void MarkEnded(const absl::Status& status, const std::string& outcome);
  void Finish(const absl::Status& status, const std::string& outcome);

  // StopTraining: the runner ends after the step in flight. False when the
  // run had already ended.
  bool RequestStop();
  bool stop_requested() const;

  // Waits until the run started or ended; its status then (the reason it
  // could not start), or DEADLINE_EXCEEDED.
  absl::Status WaitStarted(absl::Time deadline) const;

  // Results published from `cursor` on (the number published before them),
  // waiting until there is one, the run ended, or `deadline`.
  struct Results {
    std::vector<v1::StepResult> results;
    uint64_t next = 0;      // the cursor for the next call
    bool finished = false;  // ended, and nothing after `next`
    absl::Status status;    // how it ended, once finished
  };
  Results Next(uint64_t cursor, absl::Time deadline) const;
  // How many results were published so far: where an attaching client starts.
  uint64_t published() const;

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable changed_;
  v1::TrainingOperation operation_;
  bool started_ = false;
  bool ended_ = false;     // the outcome is known
  bool finished_ = false;  // and the runner is done: streams end
  absl::Status status_;
  std::deque<v1::StepResult> kept_;
  uint64_t published_ = 0;  // kept_ holds results [published_ - kept_.size(), published_)
};

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_TRAINING_RUN_H_
