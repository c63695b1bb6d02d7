#include "worker/device/host/stream_thread.h"

#include <utility>

namespace flatshard {

StreamThread::StreamThread(std::function<void()> before_work)
    : before_work_(std::move(before_work)), thread_([this] { Run(); }) {}

StreamThread::~StreamThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StreamThread::Post(std::function<absl::Status()> work) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(Task{std::move(work), nullptr});
  }
  cv_.notify_all();
}

void StreamThread::PostAlways(std::function<void(const absl::Status&)> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(Task{nullptr, std::move(task)});
  }
  cv_.notify_all();
}

void StreamThread::RunOrPostAlways(const std::function<void(const absl::Status&)>& task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.empty() && !running_) {
      task(failure_);
      return;
    }
    queue_.push_back(Task{nullptr, task});
  }
  cv_.notify_all();
}

void StreamThread::Run() {
  // Read only by this thread outside the lock; failure_ mirrors it for
  // RunOrPostAlways.
  absl::Status failure;
  while (true) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      running_ = false;
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
    }
    if (task.always) {
      task.always(failure);
    } else if (failure.ok()) {
      if (before_work_) before_work_();
      absl::Status status = task.work();
      if (!status.ok()) {
        failure = std::move(status);
        std::lock_guard<std::mutex> lock(mu_);
        failure_ = failure;
      }
    }
  }
}

}  // namespace flatshard
