// Who is in the job: worker registrations, stable rank assignment and heartbeat
// ages. Ranks are either asked for explicitly or assigned in registration order;
// a worker that registers again (a restarted daemon with the same id) keeps its
// rank. Thread-safe; time is passed in so tests control it.
#ifndef FLATSHARD_COORDINATOR_MEMBERSHIP_H_
#define FLATSHARD_COORDINATOR_MEMBERSHIP_H_

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace flatshard {

struct WorkerRecord {
  std::string worker_id;
  std::string host;
  std::string device;
  std::string address;
  int rank = -1;
  absl::Time last_heartbeat;
  uint64_t last_completed_seq = 0;
  std::string state;
  std::string metrics_address;
  std::string device_name;
  std::string identity_sha256;  // of the registration's identity secret (durable)
  std::string session;          // this registration's; memory only
  std::string command_token;    // sent with WorkerService calls; memory only
  std::string incarnation;      // the registering daemon process's; memory only
};

struct Registration {
  std::string worker_id;
  std::string host;
  std::string device;
  std::string address;
  int requested_rank = -1;  // -1: assign one
  std::string metrics_address;
  std::string device_name;
  std::string identity_secret;
  std::string command_token;
  std::string incarnation;
};

class MembershipTable {
 public:
  // `world_size` bounds the ranks; 0 leaves them unbounded. A worker that
  // heartbeat within `live_for` is live: its id cannot be taken over.
  explicit MembershipTable(int world_size, absl::Duration live_for = absl::Seconds(5))
      : world_size_(world_size), live_for_(live_for) {}

  struct Registered {
    int rank;
    std::string session;
  };
  // The worker's rank and a fresh session. INVALID_ARGUMENT for an empty id
  // or address, a device that is not a known kind (core/device_kind.h), or a
  // rank outside [0, world_size); ALREADY_EXISTS when the rank belongs to
  // another worker; RESOURCE_EXHAUSTED when every rank is taken;
  // PERMISSION_DENIED when the id belongs to a live worker whose identity
  // secret differs.
  absl::StatusOr<Registered> Register(const Registration& registration, absl::Time now);
  // NOT_FOUND for a worker that never registered, or whose registration
  // `session` is not (a restarted coordinator knows no sessions).
  absl::Status Heartbeat(const std::string& worker_id, const std::string& session,
                         uint64_t last_completed_seq, const std::string& state, absl::Time now);
  // Whether `session` is a current registration's (the store calls' proof).
  bool HasSession(const std::string& session) const;
  void set_live_for(absl::Duration live_for);
  std::vector<WorkerRecord> List() const;  // by rank
  // A worker that did not answer a probe counts as stale at once, before its
  // heartbeats time out, so neither formation nor recovery picks it; its next
  // heartbeat (a stopped process resumed) makes it live again. Only the
  // registration at `address`, the one probed: a daemon restarted under the
  // id at another address since (a supervisor's restart) stays live.
  void MarkUnreachable(const std::string& worker_id, const std::string& address);
  // A restarted coordinator's registrations from its state store; each counts
  // as live only once it heartbeats again. Until then, for the liveness
  // window after `now`, a seat registered with an identity is kept for the
  // daemon that proves it (the one coming back), as a live worker's is.
  void Restore(const std::vector<WorkerRecord>& workers, absl::Time now);
  // Called with every registration, under the table's lock (the state store
  // writes it; it must not call back into the table).
  void set_on_register(std::function<void(const WorkerRecord&)> observer);
  // Workers whose last heartbeat is older than `timeout`.
  std::vector<WorkerRecord> Stale(absl::Time now, absl::Duration timeout) const;

  // A registration taken over by another daemon process under the same id
  // (a supervisor restarted it, proving the id's secret, typically before
  // it missed heartbeats, which then never stop): the monitor learns of it
  // here, and fails only an epoch seated with the old process.
  struct Replaced {
    std::string worker_id;
    std::string old_address;
    std::string new_address;
    std::string old_incarnation;
  };
  // The takeovers since the last call (at most kMaxReplaced, the latest).
  std::vector<Replaced> TakeReplaced();
  static constexpr size_t kMaxReplaced = 1024;

 private:
  mutable std::mutex mu_;
  int world_size_;
  absl::Duration live_for_;
  absl::Time restored_at_ = absl::InfinitePast();
  std::map<std::string, WorkerRecord> by_id_;
  std::set<std::string> session_digests_;  // SHA-256 of every current session
  std::map<int, std::string> id_by_rank_;
  std::function<void(const WorkerRecord&)> on_register_;
  std::vector<Replaced> replaced_;
};

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_MEMBERSHIP_H_
