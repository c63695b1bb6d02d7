#include "worker/runtime/comm_lane.h"

namespace flatshard {

absl::Status Completion::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return done_; });
  return status_;
}

bool Completion::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void Completion::Finish(absl::Status status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = std::move(status);
    done_ = true;
  }
  cv_.notify_all();
}

CommLane::CommLane() : thread_([this] { Run(); }) {}

CommLane::~CommLane() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_ptr<Completion> CommLane::Submit(std::function<absl::Status()> task) {
  auto completion = std::make_shared<Completion>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.emplace_back(std::move(task), completion);
    last_ = completion;
  }
  cv_.notify_all();
  return completion;
}

absl::Status CommLane::Drain() {
  std::shared_ptr<Completion> last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last = last_;
  }
  if (last != nullptr) last->Wait().IgnoreError();
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

void CommLane::Run() {
  while (true) {
    std::function<absl::Status()> task;
    std::shared_ptr<Completion> completion;
    absl::Status failure;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front().first);
      completion = std::move(queue_.front().second);
      queue_.pop_front();
      failure = failure_;
    }
    absl::Status status = failure.ok() ? task() : failure;
    if (!status.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (failure_.ok()) failure_ = status;
    }
    completion->Finish(std::move(status));
  }
}

}  // namespace flatshard
