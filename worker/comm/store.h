// The rendezvous key-value store (modelled on c10d's Store): how workers find each
// other for Gloo (addresses) and NCCL (the unique id). The coordinator's
// Membership service implements it over gRPC; FileStore serves tests and the
// standalone harness. Implementations must be safe to call from several threads.
#ifndef FLATSHARD_WORKER_COMM_STORE_H_
#define FLATSHARD_WORKER_COMM_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace flatshard {

class Store {
 public:
  virtual ~Store() = default;

  // Sets `key` to `value`, replacing any earlier value, atomically: a reader sees
  // the old value or the whole new one.
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;

  // The value of `key`, waiting up to `timeout` for it to be set.
  // DEADLINE_EXCEEDED names the key when it never appears.
  virtual absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) = 0;

  // Waits until every key in `keys` is set. DEADLINE_EXCEEDED names the missing ones.
  virtual absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) = 0;

  // Atomically adds `delta` to the integer stored at `key` (0 when unset) and
  // returns the new value.
  virtual absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) = 0;

  // Fails the waits in progress, and every later call, with ABORTED naming
  // `reason`: a worker told to abort while it is in a rendezvous lets go of it
  // at once rather than at its timeout (a daemon shutting down waits for its
  // Configure). A store that cannot interrupt a wait keeps this default, and
  // its waits run to their timeouts.
  virtual void Abort(const std::string& reason) { (void)reason; }
};

// Keys of `inner` under "<prefix>/": each job epoch and process group gets its
// own namespace, so reruns never read a stale address.
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> inner)
      : prefix_(std::move(prefix)), inner_(std::move(inner)) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    return inner_->Set(Key(key), value);
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    return inner_->Get(Key(key), timeout);
  }
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    return inner_->Add(Key(key), delta);
  }
  void Abort(const std::string& reason) override { inner_->Abort(reason); }

 private:
  std::string Key(const std::string& key) const { return prefix_ + "/" + key; }

  std::string prefix_;
  std::shared_ptr<Store> inner_;
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_COMM_STORE_H_
