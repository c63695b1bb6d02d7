#include "worker/service/abort_watchdog.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace flatshard {

AbortWatchdog::AbortWatchdog(absl::Duration grace,
                             std::function<void(const std::string&)> on_wedged)
    : grace_(std::max(grace, absl::ZeroDuration())), on_wedged_(std::move(on_wedged)) {
  if (grace_ > absl::ZeroDuration()) thread_ = std::thread([this] { Watch(); });
}

AbortWatchdog::~AbortWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

uint64_t AbortWatchdog::Arm(std::string what) {
  if (!thread_.joinable()) return 0;
  uint64_t token = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    token = next_token_++;
    armed_[token] = Armed{std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(grace_),
                          std::move(what)};
  }
  changed_.notify_all();
  return token;
}

void AbortWatchdog::Disarm(uint64_t token) {
  if (token == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  armed_.erase(token);  // an earlier deadline leaving only wakes the watcher early
}

void AbortWatchdog::Watch() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    if (armed_.empty()) {
      changed_.wait(lock);
      continue;
    }
    const auto first = std::min_element(
        armed_.begin(), armed_.end(),
        [](const auto& a, const auto& b) { return a.second.deadline < b.second.deadline; });
    // A copy: Disarm may erase the entry while this waits, and wait_until
    // reads its time point again on waking.
    const std::chrono::steady_clock::time_point deadline = first->second.deadline;
    if (std::chrono::steady_clock::now() < deadline) {
      changed_.wait_until(lock, deadline);
      continue;  // woken early (armed, disarmed, stopping) or due: look again
    }
    const std::string what = absl::StrCat(first->second.what, " has not returned ",
                                          absl::FormatDuration(grace_), " after it was aborted");
    armed_.clear();
    lock.unlock();
    if (on_wedged_) on_wedged_(what);  // once: a wedged worker is not watched any further
    return;
  }
}

void WatchedBatch::Begin(std::string what, uint64_t epoch) {
  End();
  what_ = std::move(what);
  epoch_ = epoch;
}

void WatchedBatch::End() {
  watchdog_->Disarm(token_);
  what_.clear();
  epoch_ = 0;
  token_ = 0;
  aborted_.reset();
}

void WatchedBatch::Aborted(const std::string& reason, uint64_t epoch) {
  if (what_.empty() || aborted_.has_value() || (epoch != 0 && epoch_ > epoch)) return;
  aborted_ = std::chrono::steady_clock::now();
  token_ = watchdog_->Arm(absl::StrCat(what_, " (aborted: ", reason, ")"));
}

absl::Duration WatchedBatch::Draining() const { return DrainingFor(aborted_); }

absl::Duration DrainingFor(std::optional<std::chrono::steady_clock::time_point> since) {
  if (!since.has_value()) return absl::ZeroDuration();
  return std::max(absl::FromChrono(std::chrono::steady_clock::now() - *since),
                  absl::Milliseconds(1));
}

}  // namespace flatshard
