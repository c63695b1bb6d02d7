#include "worker/service/peer_snapshot_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

#include "worker/comm/background_priority.h"

namespace flatshard {
namespace {

// Received sizes above this are a damaged or hostile peer, not a snapshot.
constexpr int64_t kMaxSnapshotBytes = int64_t{1} << 40;

}  // namespace

PeerSnapshotStore::~PeerSnapshotStore() { Quiesce(); }

void PeerSnapshotStore::Quiesce() {
  if (exchange_.valid()) exchange_.wait();
}

void PeerSnapshotStore::Take(const std::string& job, const PeerSnapshotInfo& info,
                             std::shared_ptr<const std::string> own, Communicator* comm) {
  Quiesce();
  Keep(Entry{job, info, true, own});
  if (info.world_size < 2 || comm == nullptr) return;  // no neighbour to hold a copy
  exchange_ = std::async(std::launch::async, [this, job, info, own = std::move(own), comm] {
    // Behind training for the CPU, yet done within about a step
    // (worker/comm/background_priority.h).
    (void)LowerThisThreadToBackgroundPriority();
    Exchange(job, info, own, comm);
  });
}

void PeerSnapshotStore::Exchange(const std::string& job, const PeerSnapshotInfo& info,
                                 const std::shared_ptr<const std::string>& own,
                                 Communicator* comm) {
  const int next = (info.rank + 1) % info.world_size;
  const int prev = (info.rank + info.world_size - 1) % info.world_size;
  const auto failed = [&](const absl::Status& why) {
    // Not fatal: the job trains on; a recovery that needs this generation
    // finds it missing and uses an older one or a checkpoint.
    spdlog::warn("job {}: peer snapshot of step {} not exchanged with rank {}: {}", job, info.step,
                 prev, why.ToString());
  };
  auto out_size = static_cast<int64_t>(own->size());
  int64_t in_size = 0;
  if (absl::Status s =
          comm->SendRecv(&out_size, sizeof(out_size), next, &in_size, sizeof(in_size), prev);
      !s.ok()) {
    return failed(s);
  }
  if (in_size <= 0 || in_size > kMaxSnapshotBytes) {
    return failed(
        absl::DataLossError(absl::StrCat("rank ", prev, " announced ", in_size, " bytes")));
  }
  auto received = std::make_shared<std::string>(static_cast<size_t>(in_size), '\0');
  if (absl::Status s =
          comm->SendRecv(own->data(), own->size(), next, received->data(), received->size(), prev);
      !s.ok()) {
    return failed(s);
  }
  absl::StatusOr<PeerSnapshotInfo> theirs = ReadPeerSnapshotInfo(*received);
  if (!theirs.ok()) return failed(theirs.status());
  if (theirs->epoch != info.epoch || theirs->step != info.step || theirs->rank != prev ||
      theirs->world_size != info.world_size) {
    return failed(absl::FailedPreconditionError(absl::StrCat("received the snapshot of epoch ",
                                                             theirs->epoch, " step ", theirs->step,
                                                             " rank ", theirs->rank)));
  }
  Keep(Entry{job, *theirs, false, std::move(received)});
}

void PeerSnapshotStore::Keep(Entry entry) {
  std::lock_guard<std::mutex> lock(mu_);
  // One job at a time on a worker: another job's snapshots are stale.
  std::erase_if(entries_, [&](const Entry& e) { return e.job != entry.job; });
  const bool own = entry.own;
  entries_.push_back(std::move(entry));
  std::vector<size_t> same;
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].own == own) same.push_back(i);
  }
  if (static_cast<int>(same.size()) <= keep_) return;
  // Entries are in the order they were kept: the first of this kind is the
  // generation taken longest ago (a step after a rollback repeats a number).
  entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(same.front()));
}

void PeerSnapshotStore::Configuring(const std::string& job, uint64_t epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(entries_, [&](const Entry& e) { return e.job != job || e.info.epoch >= epoch; });
}

std::shared_ptr<const std::string> PeerSnapshotStore::Find(const std::string& job, uint64_t epoch,
                                                           int64_t step, int rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Entry& e : entries_) {
    if (e.job == job && e.info.epoch == epoch && e.info.step == step && e.info.rank == rank) {
      return e.bytes;
    }
  }
  return nullptr;
}

std::vector<v1::PeerSnapshotHeld> PeerSnapshotStore::Held() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<v1::PeerSnapshotHeld> held;
  for (const Entry& e : entries_) {
    v1::PeerSnapshotHeld h;
    h.set_job(e.job);
    h.set_epoch(e.info.epoch);
    h.set_step(e.info.step);
    h.set_rank(e.info.rank);
    h.set_world_size(e.info.world_size);
    h.set_own(e.own);
    h.set_bytes(static_cast<int64_t>(e.bytes->size()));
    held.push_back(std::move(h));
  }
  return held;
}

int64_t PeerSnapshotStore::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t total = 0;
  for (const Entry& e : entries_) total += static_cast<int64_t>(e.bytes->size());
  return total;
}

}  // namespace flatshard
