#include "worker/service/background_saves.h"

#include <chrono>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "rpc/checkpoint_file_proto.h"
#include "rpc/status_proto.h"

namespace flatshard {

BackgroundSaves::~BackgroundSaves() {
  std::map<std::string, Entry> saves;
  {
    std::lock_guard<std::mutex> lock(mu_);
    saves.swap(saves_);
  }
  for (auto& [key, entry] : saves) entry.done.wait();
}

void BackgroundSaves::Start(const std::string& key, ShardSnapshot snapshot, const std::string& path,
                            int rank, uint64_t seq) {
  // One background save at a time: one that the coordinator gave up on (its
  // checkpoint failed elsewhere) may still be running, and must not write
  // beside the next (a FULL save's files are opened by every rank, without
  // O_EXCL) or hold a second snapshot's memory.
  std::vector<std::shared_future<v1::CommandResult>> running;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [name, entry] : saves_) running.push_back(entry.done);
    saves_.erase(key);
  }
  for (auto& save : running) save.wait();
  // The snapshot is freed as soon as its files are written: the future's
  // shared state keeps the closure for as long as the entry is kept, and an
  // entry the coordinator stopped awaiting (a commit that gave up) stays
  // until the next save into the same directory.
  std::shared_future<v1::CommandResult> save =
      std::async(std::launch::async, [snapshot = std::optional<ShardSnapshot>(std::move(snapshot)),
                                      path, rank, seq]() mutable {
        absl::StatusOr<ShardSaveResult> written = WriteShardSnapshot(*snapshot, path);
        snapshot.reset();
        if (!written.ok()) {  // the snapshot could not be read: report it like a file error
          written = ShardSaveResult{{}, written.status()};
        }
        v1::CommandResult result;
        result.set_seq(seq);
        result.set_rank(rank);
        if (!written->write_status.ok()) {
          *result.mutable_checkpoint_status() = StatusToProto(written->write_status);
        }
        for (const CheckpointFile& f : written->files) {
          CheckpointFileToProto(f, result.add_files());
        }
        return result;
      }).share();
  std::lock_guard<std::mutex> lock(mu_);
  saves_[key] = Entry{++next_id_, std::move(save)};
}

absl::StatusOr<v1::CommandResult> BackgroundSaves::Await(const std::string& key,
                                                         absl::Time deadline) {
  Entry entry;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = saves_.find(key);
    if (it == saves_.end()) {
      return absl::NotFoundError(absl::StrCat("no async save into '", key, "' on this worker"));
    }
    entry = it->second;
  }
  if (deadline == absl::InfiniteFuture()) {
    entry.done.wait();
  } else {
    const auto wait = std::chrono::microseconds(
        std::max<int64_t>(0, absl::ToInt64Microseconds(deadline - absl::Now())));
    if (entry.done.wait_for(wait) != std::future_status::ready) {
      return absl::DeadlineExceededError(absl::StrCat("async save into '", key, "' still writing"));
    }
  }
  v1::CommandResult result = entry.done.get();
  std::lock_guard<std::mutex> lock(mu_);
  // Only this save's entry: a newer save into the same directory stays.
  if (auto it = saves_.find(key); it != saves_.end() && it->second.id == entry.id) {
    saves_.erase(it);
  }
  return result;
}

}  // namespace flatshard
