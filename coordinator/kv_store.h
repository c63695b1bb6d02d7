// The coordinator's rendezvous key-value store: what workers' Gloo rendezvous
// and NCCL unique ids go through (Membership.Store* RPCs). In memory, safe for
// concurrent RPC threads; Wait blocks on a condition variable, not a poll.
// The coordinator abandons an epoch's prefix when that epoch's formation
// fails: the ranks still waiting in its rendezvous are answered at once
// instead of at their collective timeout, so they are free for the next try.
#ifndef FLATSHARD_COORDINATOR_KV_STORE_H_
#define FLATSHARD_COORDINATOR_KV_STORE_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace flatshard {

class KvStore {
 public:
  // Limits that keep a misbehaving client from exhausting the coordinator.
  static constexpr size_t kMaxKeyBytes = 1024;
  static constexpr size_t kMaxValueBytes = 1 << 20;
  // Per job ("job/<name>/..." keys; any other key counts under its first
  // path component): a rendezvous needs a few keys per rank and communicator.
  static constexpr size_t kDefaultMaxKeysPerJob = 1 << 16;
  static constexpr size_t kDefaultMaxBytesPerJob = size_t{256} << 20;
  // Over every namespace: a session holder choosing keys in namespaces of
  // their own ("a1", "a2", ...) gets a per-job budget for each, and would
  // otherwise take the coordinator's memory.
  static constexpr size_t kDefaultMaxKeysTotal = 1 << 20;
  static constexpr size_t kDefaultMaxBytesTotal = size_t{512} << 20;

  struct Limits {
    size_t keys_per_job = kDefaultMaxKeysPerJob;
    size_t bytes_per_job = kDefaultMaxBytesPerJob;
    size_t keys_total = kDefaultMaxKeysTotal;
    size_t bytes_total = kDefaultMaxBytesTotal;
  };
  KvStore() : KvStore(Limits{}) {}
  explicit KvStore(const Limits& limits) : limits_(limits) {}

  // RESOURCE_EXHAUSTED naming the limit when the job's keys or bytes, or
  // the whole store's, would exceed it.
  absl::Status Set(const std::string& key, std::string value);
  // NOT_FOUND when absent (no waiting: use Wait first).
  absl::StatusOr<std::string> Get(const std::string& key) const;
  // DEADLINE_EXCEEDED naming the missing keys when they are not all set in time.
  // `gave_up` (when set) is asked every kGaveUpCheck while it waits: the
  // caller of a StoreWait that cancelled (a worker aborted in its rendezvous)
  // frees its server thread then, CANCELLED, not at the timeout. gRPC's
  // synchronous API tells a handler of cancellation only when asked.
  static constexpr absl::Duration kGaveUpCheck = absl::Milliseconds(100);
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout,
                    const std::function<bool()>& gave_up = nullptr) const;
  // Adds to the decimal integer at `key` (0 when unset); INVALID_ARGUMENT when the
  // key holds something else.
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta);
  // Removes every key under "<prefix>/" (a finished job epoch), and forgets
  // that prefixes under it were abandoned (a deleted job's: a new job of the
  // same name reuses them). An abandoned prefix itself stays abandoned.
  void DeletePrefix(const std::string& prefix);
  // From now on every call on a key under "<prefix>/" fails with ABORTED
  // naming `reason`, and waits on such keys return so at once.
  void Abandon(const std::string& prefix, const std::string& reason);
  size_t size() const;
  // How many Wait calls are blocked now: a rendezvous in progress (and how a
  // test knows a client's wait has reached the server).
  size_t waiting() const;

 private:
  struct Usage {
    size_t keys = 0;
    size_t bytes = 0;
  };
  static absl::Status CheckKey(const std::string& key);
  // Stores `value` at `key`, within the job's limits. Holds mu_.
  absl::Status PutLocked(const std::string& key, std::string value);
  // ABORTED when `key` is under an abandoned prefix. Holds mu_.
  absl::Status CheckNotAbandonedLocked(const std::string& key) const;

  const Limits limits_;
  mutable std::mutex mu_;
  std::map<std::string, Usage> usage_;  // by job namespace
  Usage total_;                         // of every namespace
  mutable std::condition_variable changed_;
  std::map<std::string, std::string> values_;
  std::map<std::string, std::string> abandoned_;  // prefix -> why; a few per job
  mutable size_t waiting_ = 0;
};

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_KV_STORE_H_
