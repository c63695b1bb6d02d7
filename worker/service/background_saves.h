// The background half of async checkpoint saves on one worker: each snapshot
// is written on its own thread while the worker goes on executing batches,
// and the coordinator collects the outcome through WorkerService.AwaitSave
// before it commits the checkpoint. Writers touch only their snapshot, never
// the runtime, so they need no lock against training.
//
// The writes belong to one job epoch, and its abort reaches them: a
// recovery drops every save of the epoch it replaces (the coordinator
// abandons an async checkpoint once its job fails), so a write in flight
// stops at its next unit instead of holding the snapshot's memory and the
// next Configure (which waits for it) for as long as the write takes. A write
// blocked where the abort cannot reach (a hung network mount) is watched as
// an aborted batch is: the worker ends itself after the grace
// (abort_watchdog.h), and until then GetStatus reports it draining, so a
// recovery's probe waits for that verdict instead of choosing the worker.
#ifndef FLATSHARD_WORKER_SERVICE_BACKGROUND_SAVES_H_
#define FLATSHARD_WORKER_SERVICE_BACKGROUND_SAVES_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "flatshard/v1/worker.pb.h"
#include "worker/runtime/shard_checkpoint.h"
#include "worker/service/abort_watchdog.h"

namespace flatshard {

class BackgroundSaves {
 public:
  // `watchdog` (null: none) watches the writes an abort reaches; it must
  // outlive this.
  explicit BackgroundSaves(AbortWatchdog* watchdog = nullptr) : watchdog_(watchdog) {}
  // Aborts the writes in flight (their files are removed, not committed:
  // nobody is left to collect them) and waits for them.
  ~BackgroundSaves();
  BackgroundSaves(const BackgroundSaves&) = delete;
  BackgroundSaves& operator=(const BackgroundSaves&) = delete;

  // Writes `snapshot` into `path` in the background; `key` names the save
  // for Await (the checkpoint directory as the coordinator sent it). The
  // coordinator starts a save only once it collected or gave up every
  // earlier one, so a write still running is one nobody will collect: it is
  // stopped at its next tensor (ABORTED, its files removed) and waited for
  // (one save at a time: they share the disk and a FULL file's name). Every
  // earlier outcome is dropped. After Abort, the write stops
  // before its first unit.
  void Start(const std::string& key, ShardSnapshot snapshot, const std::string& path, int rank,
             uint64_t seq);

  // The outcome of save `key` once written, as often as asked until the
  // next Start (a caller whose call was lost asks again). NOT_FOUND for
  // an unknown key, DEADLINE_EXCEEDED if still writing at `deadline`,
  // CANCELLED once `cancelled` (asked every 100 ms; unset: never) says so.
  // An aborted write's outcome carries an ABORTED checkpoint status.
  absl::StatusOr<v1::CommandResult> Await(const std::string& key, absl::Time deadline,
                                          const std::function<bool()>& cancelled = {});

  // The job these saves belong to was aborted (`reason`): every write, the
  // running ones and any started later, stops before its next tensor, and
  // the watchdog watches each one still running. Later calls change nothing.
  void Abort(const std::string& reason);

  // Waits for every write in flight.
  void Wait();

  // Counts the writes' work: one per chunk written (at most 4 MiB,
  // kSaveWriteChunk). Still while a write waits on its disk or hangs; only
  // its changes mean anything (GetStatusResponse.save_progress).
  uint64_t progress() const { return progress_.load(std::memory_order_relaxed); }

  // The writes a later Start stopped that have not returned yet.
  size_t StoppedWritesRunning() const;

  // Since when the aborted write that is still running and was watched last
  // has been watched (the one whose verdict comes last); none when no
  // aborted write runs.
  std::optional<std::chrono::steady_clock::time_point> DrainingSince() const;

 private:
  // A write that has not returned: what it is, for the watchdog's report,
  // and since when it is watched (with the watchdog's token, if any) once an
  // abort reached it.
  struct Running {
    std::string what;
    std::shared_ptr<std::atomic<bool>> superseded;  // read by its writer between units
    std::optional<std::chrono::steady_clock::time_point> watched_since;
    uint64_t token = 0;
  };

  // Starts watching `write`, once. Needs mu_ and the abort.
  void WatchLocked(Running& write);
  // The writer's last act: `id` returned.
  void Returned(uint64_t id);

  AbortWatchdog* const watchdog_;
  std::atomic<bool> aborted_{false};  // read by the writers between units
  std::atomic<uint64_t> progress_{0};
  mutable std::mutex mu_;
  // Each save's outcome, by key, until the next save.
  std::map<std::string, std::shared_future<v1::CommandResult>> saves_;
  std::map<uint64_t, Running> running_;  // by id
  uint64_t next_id_ = 0;
  std::optional<std::string> abort_reason_;  // set once aborted
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_SERVICE_BACKGROUND_SAVES_H_
