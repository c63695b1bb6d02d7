#include "worker/service/background_saves.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "rpc/checkpoint_file_proto.h"
#include "rpc/status_proto.h"

namespace flatshard {

BackgroundSaves::~BackgroundSaves() {
  Abort("its job is gone");
  Wait();
}

void BackgroundSaves::Wait() {
  std::vector<std::shared_future<v1::CommandResult>> running;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, done] : saves_) running.push_back(done);
  }
  for (auto& save : running) save.wait();
}

void BackgroundSaves::Start(const std::string& key, ShardSnapshot snapshot, const std::string& path,
                            int rank, uint64_t seq) {
  {
    // The coordinator commits one save at a time: it begins this one only
    // once it collected every earlier save or gave up on it (its checkpoint
    // failed on another rank, a commit abandoned with its job, a restarted
    // coordinator). A write still running is one nobody will collect: it
    // stops before its next write rather than hold this batch (and run_mu_)
    // for the rest of its write. It is not watched: the epoch is healthy,
    // and the final fsync of a healthy write on slow storage may outlast
    // the abort grace. The coordinator's stall detector bounds the wait (the
    // other ranks answer this batch at once), and an abort of the epoch
    // meanwhile watches it as any other write.
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, write] : running_) write.superseded->store(true);
  }
  // One background save at a time: the stopped one must not write beside the
  // next (a FULL save's files are opened by every rank, without O_EXCL) or
  // hold a second snapshot's memory.
  Wait();
  uint64_t id = 0;
  auto superseded = std::make_shared<std::atomic<bool>>(false);
  {
    std::lock_guard<std::mutex> lock(mu_);
    saves_.clear();  // outcomes nobody will ask for
    id = ++next_id_;
    Running& write = running_[id];
    write.what = absl::StrCat("async save of batch seq ", seq, " into '", key, "' on rank ", rank);
    write.superseded = superseded;
    if (abort_reason_.has_value()) WatchLocked(write);
  }
  // The snapshot is freed as soon as its files are written: the future's
  // shared state keeps the closure for as long as the outcome is kept, until
  // the next save.
  auto write = [this, id, path, rank, seq, superseded,
                snapshot = std::optional<ShardSnapshot>(std::move(snapshot))]() mutable {
    // Whatever happens, the write is not left watched once it returned.
    absl::Cleanup returned = [this, id] { Returned(id); };
    // Asked before each chunk written: each counts as progress.
    const std::function<bool()> aborted = [this, superseded] {
      progress_.fetch_add(1, std::memory_order_relaxed);
      return aborted_.load() || superseded->load();
    };
    absl::StatusOr<ShardSaveResult> written = WriteShardSnapshot(*snapshot, path, aborted);
    snapshot.reset();
    // Not readable, or aborted: reported like a file error.
    if (!written.ok()) written = ShardSaveResult{{}, written.status()};
    v1::CommandResult result;
    result.set_seq(seq);
    result.set_rank(rank);
    if (!written->write_status.ok()) {
      *result.mutable_checkpoint_status() = StatusToProto(written->write_status);
    }
    for (const CheckpointFile& f : written->files) {
      CheckpointFileToProto(f, result.add_files());
    }
    std::move(returned).Invoke();  // before the future is ready, which the destructor waits for
    return result;
  };
  std::shared_future<v1::CommandResult> save;
  try {
    save = std::async(std::launch::async, std::move(write)).share();
  } catch (const std::system_error& e) {
    // No thread for it (the process is out of them): the save fails here,
    // as a file error would, rather than leaving its write watched forever.
    Returned(id);
    v1::CommandResult failed;
    failed.set_seq(seq);
    failed.set_rank(rank);
    *failed.mutable_checkpoint_status() = StatusToProto(absl::ResourceExhaustedError(
        absl::StrCat("cannot start the async save's writer thread: ", e.what())));
    std::promise<v1::CommandResult> now;
    now.set_value(std::move(failed));
    save = now.get_future().share();
  }
  std::lock_guard<std::mutex> lock(mu_);
  saves_[key] = std::move(save);
}

void BackgroundSaves::Abort(const std::string& reason) {
  aborted_.store(true);
  std::lock_guard<std::mutex> lock(mu_);
  if (abort_reason_.has_value()) return;
  abort_reason_ = reason;
  for (auto& [id, write] : running_) WatchLocked(write);
}

size_t BackgroundSaves::StoppedWritesRunning() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t stopped = 0;
  for (const auto& [id, write] : running_) stopped += write.superseded->load() ? 1u : 0u;
  return stopped;
}

std::optional<std::chrono::steady_clock::time_point> BackgroundSaves::DrainingSince() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::optional<std::chrono::steady_clock::time_point> latest;
  for (const auto& [id, write] : running_) {
    if (write.watched_since.has_value() &&
        (!latest.has_value() || *write.watched_since > *latest)) {
      latest = write.watched_since;
    }
  }
  return latest;
}

void BackgroundSaves::WatchLocked(Running& write) {
  if (write.watched_since.has_value()) return;
  write.watched_since = std::chrono::steady_clock::now();
  if (watchdog_ != nullptr) {
    write.token = watchdog_->Arm(absl::StrCat(write.what, " (aborted: ", *abort_reason_, ")"));
  }
}

void BackgroundSaves::Returned(uint64_t id) {
  uint64_t token = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = running_.find(id); it != running_.end()) {
      token = it->second.token;
      running_.erase(it);
    }
  }
  if (watchdog_ != nullptr) watchdog_->Disarm(token);
}

absl::StatusOr<v1::CommandResult> BackgroundSaves::Await(const std::string& key,
                                                         absl::Time deadline,
                                                         const std::function<bool()>& cancelled) {
  std::shared_future<v1::CommandResult> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = saves_.find(key);
    if (it == saves_.end()) {
      return absl::NotFoundError(absl::StrCat("no async save into '", key, "' on this worker"));
    }
    done = it->second;
  }
  // In slices when the caller can give up: nothing wakes a future's wait.
  constexpr absl::Duration kCancelCheck = absl::Milliseconds(100);
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    const absl::Duration slice = cancelled ? std::min(left, kCancelCheck) : left;
    if (slice == absl::InfiniteDuration()) {
      done.wait();
      break;
    }
    const auto wait = absl::ToChronoMicroseconds(std::max(slice, absl::ZeroDuration()));
    if (done.wait_for(wait) == std::future_status::ready) break;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("async save into '", key, "' still writing"));
    }
    if (cancelled && cancelled()) {
      return absl::CancelledError(
          absl::StrCat("the wait for the async save into '", key, "' was cancelled"));
    }
  }
  // Kept for a later Await, until the next save: the call that carries this
  // answer may be lost (its caller's deadline passing as the write ends),
  // and the coordinator asks again. It is small (the files' names and
  // digests); the snapshot went with the write.
  return done.get();
}

}  // namespace flatshard
