#include "coordinator/job_state_machine.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace flatshard {

JobStateMachine::JobStateMachine(std::string job_name) : job_name_(std::move(job_name)) {
  events_.push_back({v1::PENDING, "job created; waiting for workers", absl::Now()});
}

bool JobStateMachine::Allowed(v1::JobState from, v1::JobState to) {
  if (from == v1::STOPPED) return false;
  if (to == v1::STOPPED) return true;
  if (to == v1::FAILED) return from != v1::FAILED;
  switch (from) {
    case v1::PENDING:
      return to == v1::FORMING;
    case v1::FORMING:
      // A recovery's re-formation that a second failure interrupted recovers again.
      return to == v1::READY || to == v1::RECOVERING;
    case v1::READY:
    case v1::IDLE:
      return to == v1::TRAINING || to == v1::RECOVERING;
    case v1::TRAINING:
      return to == v1::IDLE || to == v1::RECOVERING;
    case v1::RECOVERING:
      // Re-forms like a failed job, but by itself; a restarted coordinator
      // re-adopts the workers as they are (READY) or rolls back (RECOVERING
      // again, from a checkpoint).
      return to == v1::FORMING || to == v1::READY || to == v1::RECOVERING;
    case v1::FAILED:
      return to == v1::FORMING;
    default:
      return false;
  }
}

v1::JobState JobStateMachine::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

std::string JobStateMachine::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

JobStateMachine::Recorded JobStateMachine::ForRecord() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (recording_.has_value()) return *recording_;
  return Recorded{state_, failure_};
}

absl::Status JobStateMachine::CheckLocked(std::optional<v1::JobState> from, v1::JobState to) const {
  if (from.has_value() && state_ != *from) {
    return absl::FailedPreconditionError(absl::StrCat("job '", job_name_, "' is ",
                                                      v1::JobState_Name(state_), ", not ",
                                                      v1::JobState_Name(*from)));
  }
  if (!Allowed(state_, to)) {
    return absl::FailedPreconditionError(absl::StrCat("job '", job_name_, "' is ",
                                                      v1::JobState_Name(state_), ", cannot go to ",
                                                      v1::JobState_Name(to)));
  }
  return absl::OkStatus();
}

absl::Status JobStateMachine::TransitionChecked(std::optional<v1::JobState> from, v1::JobState to,
                                                const std::string& message) {
  std::lock_guard<std::mutex> serial(transition_mu_);
  std::function<void()> observer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status allowed = CheckLocked(from, to); !allowed.ok()) return allowed;
    observer = on_transition_;
    recording_ = Recorded{to, to == v1::FAILED ? message : failure_};
  }
  // Recorded first, outside the lock (the observer reads the job, which
  // reads the state); the state cannot change meanwhile: transitions are
  // serialized, and Restore runs before any.
  if (observer) observer();
  std::lock_guard<std::mutex> lock(mu_);
  recording_.reset();
  state_ = to;
  if (to == v1::FAILED) failure_ = message;
  events_.push_back({to, message, absl::Now()});
  changed_.notify_all();
  return absl::OkStatus();
}

absl::Status JobStateMachine::Transition(v1::JobState to, const std::string& message) {
  return TransitionChecked(std::nullopt, to, message);
}

absl::Status JobStateMachine::TransitionFrom(v1::JobState from, v1::JobState to,
                                             const std::string& message) {
  return TransitionChecked(from, to, message);
}

void JobStateMachine::Restore(v1::JobState state, const std::string& failure,
                              const std::string& message) {
  std::lock_guard<std::mutex> serial(transition_mu_);
  std::lock_guard<std::mutex> lock(mu_);
  state_ = state;
  failure_ = failure;
  // The history starts here: "job created" happened before the restart.
  events_.clear();
  events_.push_back({state, message, absl::Now()});
  changed_.notify_all();
}

void JobStateMachine::set_on_transition(std::function<void()> observer) {
  std::lock_guard<std::mutex> lock(mu_);
  on_transition_ = std::move(observer);
}

std::vector<JobEventRecord> JobStateMachine::EventsFrom(size_t next, absl::Time deadline,
                                                        bool* closed) const {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_until(lock, absl::ToChronoTime(deadline),
                      [&] { return closed_ || events_.size() > next; });
  if (closed != nullptr) *closed = closed_;
  // Restore (which starts a new history) comes before any close.
  const size_t last = closed_ ? std::min(watchable_, events_.size()) : events_.size();
  if (next >= last) return {};
  return std::vector<JobEventRecord>(events_.begin() + static_cast<std::ptrdiff_t>(next),
                                     events_.begin() + static_cast<std::ptrdiff_t>(last));
}

void JobStateMachine::Close(absl::Status end) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return;
  closed_ = true;
  watchable_ = events_.size();
  end_ = std::move(end);
  changed_.notify_all();
}

bool JobStateMachine::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

absl::Status JobStateMachine::end() const {
  std::lock_guard<std::mutex> lock(mu_);
  return end_;
}

}  // namespace flatshard
