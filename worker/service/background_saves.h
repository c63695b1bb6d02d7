// The background half of async checkpoint saves on one worker: each snapshot
// is written on its own thread while the worker goes on executing batches,
// and the coordinator collects the outcome through WorkerService.AwaitSave
// before it commits the checkpoint. Writers touch only their snapshot, never
// the runtime, so they need no lock against training.
#ifndef FLATSHARD_WORKER_SERVICE_BACKGROUND_SAVES_H_
#define FLATSHARD_WORKER_SERVICE_BACKGROUND_SAVES_H_

#include <future>
#include <map>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "flatshard/v1/worker.pb.h"
#include "worker/runtime/shard_checkpoint.h"

namespace flatshard {

class BackgroundSaves {
 public:
  BackgroundSaves() = default;
  // Waits for the writes in flight: a snapshot is never dropped half-written.
  ~BackgroundSaves();
  BackgroundSaves(const BackgroundSaves&) = delete;
  BackgroundSaves& operator=(const BackgroundSaves&) = delete;

  // Writes `snapshot` into `path` in the background; `key` names the save
  // for Await (the checkpoint directory as the coordinator sent it). Waits
  // first for any save still running: they share one communicator.
  void Start(const std::string& key, ShardSnapshot snapshot, const std::string& path, int rank,
             uint64_t seq);

  // The outcome of save `key` once written (then forgotten). NOT_FOUND for
  // an unknown key, DEADLINE_EXCEEDED if still writing at `deadline`.
  absl::StatusOr<v1::CommandResult> Await(const std::string& key, absl::Time deadline);

 private:
  struct Entry {
    uint64_t id = 0;
    std::shared_future<v1::CommandResult> done;
  };
  std::mutex mu_;
  std::map<std::string, Entry> saves_;
  uint64_t next_id_ = 0;
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_SERVICE_BACKGROUND_SAVES_H_
