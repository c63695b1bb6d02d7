#include "coordinator/training_run.h"

#include <algorithm>
#include <utility>

namespace flatshard {

TrainingRun::TrainingRun(v1::TrainingOperation operation) : operation_(std::move(operation)) {
  operation_.set_running(true);
}

v1::TrainingOperation TrainingRun::operation() const {
  std::lock_guard<std::mutex> lock(mu_);
  return operation_;
}

void TrainingRun::MarkStarted() {
  std::lock_guard<std::mutex> lock(mu_);
  started_ = true;
  changed_.notify_all();
}

void TrainingRun::Publish(const v1::StepResult& result) {
  std::lock_guard<std::mutex> lock(mu_);
  kept_.push_back(result);
  if (kept_.size() > kKeptResults) kept_.pop_front();
  ++published_;
  changed_.notify_all();
}

void TrainingRun::MarkEnded(const absl::Status& status, const std::string& outcome) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ended_) return;  // the first end is the one
  ended_ = true;
  status_ = status;
  operation_.set_running(false);
  operation_.set_outcome(outcome);
}

void TrainingRun::Finish(const absl::Status& status, const std::string& outcome) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!ended_) {
    ended_ = true;
    status_ = status;
    operation_.set_running(false);
    operation_.set_outcome(outcome);
  }
  finished_ = true;
  changed_.notify_all();
}

bool TrainingRun::RequestStop() {
  std::lock_guard<std::mutex> lock(mu_);
  if (ended_) return false;
  operation_.set_stop_requested(true);
  return true;
}

bool TrainingRun::stop_requested() const {
  std::lock_guard<std::mutex> lock(mu_);
  return operation_.stop_requested();
}

absl::Status TrainingRun::WaitStarted(absl::Time deadline) const {
  std::unique_lock<std::mutex> lock(mu_);
  if (!changed_.wait_until(lock, absl::ToChronoTime(deadline),
                           [this] { return started_ || finished_; })) {
    return absl::DeadlineExceededError("the training did not start in time");
  }
  return started_ ? absl::OkStatus() : status_;
}

TrainingRun::Results TrainingRun::Next(uint64_t cursor, absl::Time deadline) const {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_until(lock, absl::ToChronoTime(deadline),
                      [&] { return finished_ || published_ > cursor; });
  Results out;
  const uint64_t first = published_ - kept_.size();
  for (uint64_t i = std::max(cursor, first); i < published_; ++i) {
    out.results.push_back(kept_[i - first]);
  }
  out.next = published_;
  out.finished = finished_;
  if (finished_) out.status = status_;
  return out;
}

uint64_t TrainingRun::published() const {
  std::lock_guard<std::mutex> lock(mu_);
  return published_;
}

}  // namespace flatshard
