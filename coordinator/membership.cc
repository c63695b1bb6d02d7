#include "coordinator/membership.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "rpc/secrets.h"

#include "core/device_kind.h"

namespace flatshard {

absl::StatusOr<MembershipTable::Registered> MembershipTable::Register(const Registration& r,
                                                                      absl::Time now) {
  if (r.worker_id.empty()) {
    return absl::InvalidArgumentError("register.worker_id must not be empty");
  }
  if (r.address.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("register.address must not be empty (worker '", r.worker_id, "')"));
  }
  // An empty device is a CPU worker (registrations predating device kinds).
  const std::string device = r.device.empty() ? "cpu" : r.device;
  if (absl::Status kind = ParseDeviceKind(device).status(); !kind.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("register.device of worker '", r.worker_id, "': ", kind.message()));
  }
  if (r.requested_rank < -1 || (world_size_ > 0 && r.requested_rank >= world_size_)) {
    return absl::InvalidArgumentError(absl::StrCat("register.requested_rank ", r.requested_rank,
                                                   " is outside [0, ", world_size_, ")"));
  }
  const std::string identity = r.identity_secret.empty() ? "" : Sha256Hex(r.identity_secret);
  std::lock_guard<std::mutex> lock(mu_);
  auto existing = by_id_.find(r.worker_id);
  int rank = -1;
  if (existing != by_id_.end()) {
    // A live worker's seat is taken over only by the same daemon (restarted,
    // or re-registering after a coordinator restart): one that proves the
    // identity the seat was first registered with.
    const WorkerRecord& old = existing->second;
    const bool foreign =
        !old.identity_sha256.empty() && !ConstantTimeEquals(old.identity_sha256, identity);
    if (foreign && now - old.last_heartbeat <= live_for_) {
      return absl::PermissionDeniedError(absl::StrCat(
          "worker id '", r.worker_id, "' belongs to a live worker at ", old.address,
          "; registering under it needs that worker's identity secret (its --state-dir)"));
    }
    // A restored seat has no heartbeat yet: kept for its own daemon, whose
    // registration is due within the liveness window, so another cannot take
    // its place (and its rank in the job) first.
    if (foreign && old.state == "restored" && now - restored_at_ <= live_for_) {
      return absl::PermissionDeniedError(absl::StrCat(
          "worker id '", r.worker_id, "' was registered at ", old.address,
          " before the coordinator restarted and that worker has not registered again yet; "
          "registering under it needs its identity secret (its --state-dir), or wait ",
          absl::FormatDuration(live_for_), " for the seat to be released"));
    }
    rank = existing->second.rank;
    if (r.requested_rank >= 0 && r.requested_rank != rank) {
      return absl::AlreadyExistsError(absl::StrCat("register.requested_rank: worker '", r.worker_id,
                                                   "' already has rank ", rank,
                                                   "; it cannot move to rank ", r.requested_rank));
    }
  } else if (r.requested_rank >= 0) {
    auto owner = id_by_rank_.find(r.requested_rank);
    if (owner != id_by_rank_.end()) {
      return absl::AlreadyExistsError(absl::StrCat("register.requested_rank: rank ",
                                                   r.requested_rank, " already belongs to worker '",
                                                   owner->second, "'"));
    }
    rank = r.requested_rank;
  } else {
    rank = 0;
    while (id_by_rank_.contains(rank)) ++rank;
    if (world_size_ > 0 && rank >= world_size_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "all ", world_size_, " ranks are taken; worker '", r.worker_id, "' cannot join"));
    }
  }
  WorkerRecord& record = by_id_[r.worker_id];
  // Another process than the registration's (restored ones have none):
  // whatever that one held is gone.
  if (!record.incarnation.empty() && !r.incarnation.empty() &&
      record.incarnation != r.incarnation) {
    if (replaced_.size() == kMaxReplaced) replaced_.erase(replaced_.begin());
    replaced_.push_back(Replaced{r.worker_id, record.address, r.address, record.incarnation});
  }
  if (!record.session.empty()) session_digests_.erase(Sha256Hex(record.session));
  record = WorkerRecord{r.worker_id,
                        r.host,
                        device,
                        r.address,
                        rank,
                        now,
                        0,
                        "registered",
                        r.metrics_address,
                        r.device_name.empty() ? device : r.device_name,
                        identity,
                        RandomSecret(),
                        r.command_token,
                        r.incarnation};
  id_by_rank_[rank] = r.worker_id;
  session_digests_.insert(Sha256Hex(record.session));
  if (on_register_) on_register_(record);
  return Registered{rank, record.session};
}

bool MembershipTable::HasSession(const std::string& session) const {
  if (session.empty()) return false;
  // Looked up by digest: every store call asks, so no scan of every worker,
  // and a lookup's timing tells nothing about a session a caller cannot
  // steer the digest of.
  const std::string digest = Sha256Hex(session);
  std::lock_guard<std::mutex> lock(mu_);
  return session_digests_.contains(digest);
}

void MembershipTable::set_live_for(absl::Duration live_for) {
  std::lock_guard<std::mutex> lock(mu_);
  live_for_ = live_for;
}

void MembershipTable::Restore(const std::vector<WorkerRecord>& workers, absl::Time now) {
  std::lock_guard<std::mutex> lock(mu_);
  restored_at_ = now;
  for (WorkerRecord w : workers) {
    if (w.worker_id.empty() || w.rank < 0 || id_by_rank_.contains(w.rank)) continue;
    // Not live until it heartbeats: a restarted coordinator knows who was
    // there, not who still is.
    w.last_heartbeat = absl::InfinitePast();
    w.last_completed_seq = 0;
    w.state = "restored";
    w.session.clear();  // sessions die with the coordinator: the worker registers again
    w.command_token.clear();
    id_by_rank_[w.rank] = w.worker_id;
    by_id_[w.worker_id] = std::move(w);
  }
}

void MembershipTable::set_on_register(std::function<void(const WorkerRecord&)> observer) {
  std::lock_guard<std::mutex> lock(mu_);
  on_register_ = std::move(observer);
}

absl::Status MembershipTable::Heartbeat(const std::string& worker_id, const std::string& session,
                                        uint64_t last_completed_seq, const std::string& state,
                                        absl::Time now) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(worker_id);
  if (it == by_id_.end()) {
    return absl::NotFoundError(
        absl::StrCat("worker '", worker_id, "' is not registered; call Register first"));
  }
  if (it->second.session.empty() || !ConstantTimeEquals(it->second.session, session)) {
    return absl::NotFoundError(absl::StrCat("worker '", worker_id,
                                            "' has no registration with this session; call "
                                            "Register again"));
  }
  it->second.last_heartbeat = now;
  it->second.last_completed_seq = last_completed_seq;
  if (!state.empty()) it->second.state = state;
  return absl::OkStatus();
}

std::vector<MembershipTable::Replaced> MembershipTable::TakeReplaced() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(replaced_, {});
}

std::vector<WorkerRecord> MembershipTable::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<WorkerRecord> out;
  for (const auto& [rank, id] : id_by_rank_) out.push_back(by_id_.at(id));
  return out;
}

void MembershipTable::MarkUnreachable(const std::string& worker_id, const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(worker_id);
  if (it == by_id_.end() || it->second.address != address) return;
  it->second.last_heartbeat = absl::InfinitePast();
  it->second.state = "unreachable";
}

std::vector<WorkerRecord> MembershipTable::Stale(absl::Time now, absl::Duration timeout) const {
  std::vector<WorkerRecord> out;
  for (WorkerRecord& record : List()) {
    if (now - record.last_heartbeat > timeout) out.push_back(std::move(record));
  }
  return out;
}

}  // namespace flatshard
