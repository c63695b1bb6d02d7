// The in-memory peer snapshots one worker holds (docs/fault-tolerance.md "In-memory
// peer snapshots"): its own, taken at a TakePeerSnapshot batch, and the copy
// of its ring predecessor's that the background exchange receives. They live
// in the worker service, not in a job's runtime, because they must outlive
// the epoch that took them: the recovery that needs them re-configures the
// worker first. Each kind keeps the `keep` generations taken last.
#ifndef FLATSHARD_WORKER_SERVICE_PEER_SNAPSHOT_STORE_H_
#define FLATSHARD_WORKER_SERVICE_PEER_SNAPSHOT_STORE_H_

#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "flatshard/v1/worker.pb.h"
#include "worker/comm/communicator.h"
#include "worker/runtime/peer_snapshot.h"

namespace flatshard {

class PeerSnapshotStore {
 public:
  // Three of each: the exchange of generation g may still run while a rank
  // takes g + 1 (and its neighbour g + 2), so g - 1 is the newest one that is
  // surely complete everywhere, and every rank must still hold it.
  explicit PeerSnapshotStore(int keep = 3) : keep_(keep) {}
  // Waits for the exchange in flight.
  ~PeerSnapshotStore();
  PeerSnapshotStore(const PeerSnapshotStore&) = delete;
  PeerSnapshotStore& operator=(const PeerSnapshotStore&) = delete;

  // Keeps `own` (described by `info`) as job `job`'s, then sends it to ring
  // successor (rank + 1) and receives the predecessor's over `comm` in the
  // background. Waits first for the previous exchange: one at a time, so a
  // rank's received copies trail its own by at most one generation. `comm`
  // must stay alive until Quiesce returns (it is aborted with its runtime).
  void Take(const std::string& job, const PeerSnapshotInfo& info,
            std::shared_ptr<const std::string> own, Communicator* comm);
  // Waits for the exchange in flight, if any.
  void Quiesce();
  // Job `job` is being configured for `epoch`: snapshots of another job, or
  // of this epoch or a later one, belong to an earlier incarnation of the
  // job (deleted and created again under its name) and go.
  void Configuring(const std::string& job, uint64_t epoch);

  // Old rank `rank`'s snapshot of (epoch, step) of `job`, own or received;
  // null when not held.
  std::shared_ptr<const std::string> Find(const std::string& job, uint64_t epoch, int64_t step,
                                          int rank) const;
  std::vector<v1::PeerSnapshotHeld> Held() const;
  int64_t bytes() const;

 private:
  struct Entry {
    std::string job;
    PeerSnapshotInfo info;
    bool own = false;
    std::shared_ptr<const std::string> bytes;
  };
  void Keep(Entry entry);
  void Exchange(const std::string& job, const PeerSnapshotInfo& info,
                const std::shared_ptr<const std::string>& own, Communicator* comm);

  const int keep_;
  mutable std::mutex mu_;
  std::vector<Entry> entries_;
  std::future<void> exchange_;  // touched only by Take and Quiesce, which run_mu_ orders
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_SERVICE_PEER_SNAPSHOT_STORE_H_
