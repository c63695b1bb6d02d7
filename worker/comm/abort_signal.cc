#include "worker/comm/abort_signal.h"

#include <utility>

namespace flatshard {

AbortSignal::Registration::~Registration() { signal_->Unregister(id_); }

void AbortSignal::Abort(const std::string& reason) {
  std::unique_lock<std::mutex> lock(mu_);
  if (aborted_) return;
  aborted_ = true;
  reason_ = reason;
  // Hooks run outside mu_ (they close sockets, take their owners' locks, and
  // a hook may end another registration). Each is looked up again after the
  // last one ran: a registration ended meanwhile is skipped.
  for (auto it = hooks_.begin(); it != hooks_.end();) {
    running_ = it->first;
    Hook hook = it->second;
    lock.unlock();
    hook(reason);
    lock.lock();
    // Done before the next starts: ending this registration now must not
    // wait for the next hook too.
    const uint64_t ran = std::exchange(running_, 0);
    hook_done_.notify_all();
    it = hooks_.upper_bound(ran);
  }
}

std::unique_ptr<AbortSignal::Registration> AbortSignal::OnAbort(Hook hook) {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t id = next_id_++;
  auto registration = std::make_unique<Registration>(shared_from_this(), id);
  if (aborted_) {
    const std::string reason = reason_;
    lock.unlock();
    hook(reason);
    return registration;
  }
  hooks_.emplace(id, std::move(hook));
  return registration;
}

void AbortSignal::Unregister(uint64_t id) {
  std::unique_lock<std::mutex> lock(mu_);
  hooks_.erase(id);
  hook_done_.wait(lock, [&] { return running_ != id; });
}

bool AbortSignal::aborted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return aborted_;
}

std::string AbortSignal::reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reason_;
}

}  // namespace flatshard
