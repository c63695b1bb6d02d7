// A one-shot abort for waits that no flag can interrupt. A Gloo rank waiting
// for a peer to connect sleeps inside Gloo until the connection or its
// timeout (five collective timeouts); only closing its socket from another
// thread wakes it. Whoever waits like that registers how to be woken
// (OnAbort); whoever aborts (a worker re-configured for a newer epoch, told
// to abort, or shutting down) calls Abort once for all of them.
#ifndef FLATSHARD_WORKER_COMM_ABORT_SIGNAL_H_
#define FLATSHARD_WORKER_COMM_ABORT_SIGNAL_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace flatshard {

class AbortSignal : public std::enable_shared_from_this<AbortSignal> {
 public:
  using Hook = std::function<void(const std::string& reason)>;

  // Ends a hook's registration: after its destruction the hook never runs,
  // and the destructor waits for a run in progress on another thread. So a
  // hook may capture what the registration's owner destroys after it.
  class Registration {
   public:
    Registration(std::shared_ptr<AbortSignal> signal, uint64_t id)
        : signal_(std::move(signal)), id_(id) {}
    ~Registration();
    Registration(const Registration&) = delete;
    Registration& operator=(const Registration&) = delete;

   private:
    std::shared_ptr<AbortSignal> signal_;
    uint64_t id_;
  };

  // The first call runs every registered hook once, on this thread, with
  // `reason`; later calls do nothing.
  void Abort(const std::string& reason);

  // `hook` runs on Abort, or here at once if the signal was aborted already.
  // Hooks must not block for long: Abort runs them one after another. (The
  // longest, a Gloo rendezvous's, takes up to GlooMeshContext::kAcceptGrace,
  // 250 ms.) A hook may end other registrations, not its own (that waits for
  // itself).
  [[nodiscard]] std::unique_ptr<Registration> OnAbort(Hook hook);

  bool aborted() const;
  std::string reason() const;

 private:
  void Unregister(uint64_t id);

  mutable std::mutex mu_;
  std::condition_variable hook_done_;
  bool aborted_ = false;
  std::string reason_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, Hook> hooks_;
  uint64_t running_ = 0;  // the hook Abort runs now (0: none)
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_COMM_ABORT_SIGNAL_H_
