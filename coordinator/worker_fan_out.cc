#include "coordinator/worker_fan_out.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <utility>

namespace flatshard {
namespace {

// The answers of one fan-out as they come in. Shared with every callback, so
// a callback that runs after the waiter has returned (it cannot, but a client
// that calls `done` and then touches its closure could) finds it alive. Plain
// std::mutex, not Abseil's synchronization: ThreadSanitizer sees through the
// former only (Debian's Abseil is not instrumented), and the hand-off of
// every answer to the waiter is what it must check here.
template <typename T>
class Collected {
 public:
  explicit Collected(size_t n) : values_(n), missing_(n) {}

  void Put(size_t i, T value) {
    std::lock_guard<std::mutex> lock(mu_);
    values_[i] = std::move(value);
    // Under the lock: the waiter cannot return (and drop its reference)
    // before this notify is done.
    if (--missing_ == 0) all_in_.notify_all();
  }
  std::vector<T> Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    all_in_.wait(lock, [this] { return missing_ == 0; });
    return std::move(values_);
  }

 private:
  std::mutex mu_;
  std::condition_variable all_in_;
  std::vector<T> values_;
  size_t missing_;
};

}  // namespace

absl::Duration FanOutTimeout(absl::Duration one, size_t calls, FanOutChannels channels) {
  const absl::Duration each =
      channels == FanOutChannels::kConnecting ? kConnectAllowancePerCall : kFanOutAllowancePerCall;
  return calls <= 1 ? one : one + each * static_cast<int64_t>(calls - 1);
}

std::vector<absl::Status> ConfigureAll(
    absl::Span<WorkerClient* const> workers, std::vector<v1::ConfigureRequest> requests,
    absl::Time deadline, const std::function<void(size_t, const absl::Status&)>& failed,
    const std::function<bool()>& abandoned) {
  assert(requests.size() == workers.size() && "one request a worker");
  auto outcomes = std::make_shared<Collected<absl::Status>>(workers.size());
  auto any_failed = std::make_shared<std::atomic<bool>>(false);
  const absl::Time connect_by = std::min(
      deadline,
      absl::Now() + FanOutTimeout(kConnectGrace, workers.size(), FanOutChannels::kConnecting));
  const auto given_up = [&] { return any_failed->load() || (abandoned && abandoned()); };
  for (size_t i = 0; i < workers.size(); ++i) {
    if (given_up()) {
      outcomes->Put(i, absl::CancelledError("not configured: the formation ended first"));
      continue;
    }
    // `failed` is the caller's, alive until Wait returns, and every call runs
    // it before its Put.
    workers[i]->ConfigureAsync(std::move(requests[i]), connect_by, deadline,
                               [outcomes, any_failed, &failed, i](absl::Status s) {
                                 if (!s.ok()) {
                                   any_failed->store(true);
                                   if (failed) failed(i, s);
                                 }
                                 outcomes->Put(i, std::move(s));
                               });
    // Its call is registered now: a cancel that came before is redone.
    if (given_up()) workers[i]->CancelAll();
  }
  return outcomes->Wait();
}

std::vector<absl::StatusOr<v1::GetStatusResponse>> GetStatusAll(
    absl::Span<WorkerClient* const> workers, absl::Time deadline) {
  auto answers = std::make_shared<Collected<absl::StatusOr<v1::GetStatusResponse>>>(workers.size());
  for (size_t i = 0; i < workers.size(); ++i) {
    workers[i]->GetStatusAsync(deadline, [answers, i](absl::StatusOr<v1::GetStatusResponse> a) {
      answers->Put(i, std::move(a));
    });
  }
  return answers->Wait();
}

std::vector<absl::Status> AbortAll(absl::Span<WorkerClient* const> workers, uint64_t epoch,
                                   const std::string& reason, absl::Time deadline) {
  auto outcomes = std::make_shared<Collected<absl::Status>>(workers.size());
  for (size_t i = 0; i < workers.size(); ++i) {
    workers[i]->AbortAsync(epoch, reason, deadline,
                           [outcomes, i](absl::Status s) { outcomes->Put(i, std::move(s)); });
  }
  return outcomes->Wait();
}

}  // namespace flatshard
