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

void StreamThread::Run() {
  while (true) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    if (task.always) {
      task.always(failure_);
    } else if (failure_.ok()) {
      if (before_work_) before_work_();
      absl::Status status = task.work();
      if (!status.ok()) failure_ = std::move(status);
    }
  }
}

}  // namespace flatshard
