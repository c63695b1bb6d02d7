// A gate a test puts in a call's way: once armed, every caller waits in
// Pass() until the test releases it. The test learns that a caller arrived
// (WaitEntered), does what must happen meanwhile, then lets it go. Nothing
// else lets a caller go (no cancellation reaches it): a test releases the
// gate on every way out, before anything waits for the held call.
#ifndef FLATSHARD_TESTS_INTEGRATION_GATE_H_
#define FLATSHARD_TESTS_INTEGRATION_GATE_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace flatshard::testing {

class Gate {
 public:
  void Pass() {
    std::unique_lock<std::mutex> lock(mu_);
    if (!armed_) return;
    entered_ = true;
    cv_.notify_all();
    cv_.wait(lock, [this] { return !armed_; });
  }
  void Arm() {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = true;
    entered_ = false;
  }
  // True once a caller waits (within `patience`).
  bool WaitEntered(std::chrono::seconds patience) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, patience, [this] { return entered_; });
  }
  // Lets every waiting caller go, and the later ones pass.
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = false;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool armed_ = false;
  bool entered_ = false;
};

}  // namespace flatshard::testing

#endif  // FLATSHARD_TESTS_INTEGRATION_GATE_H_
