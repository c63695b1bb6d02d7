#include "worker/service/background_saves.h"

#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace flatshard {

BackgroundSaves::~BackgroundSaves() {
  std::map<std::string, std::shared_future<v1::CommandResult>> saves;
  {
    std::lock_guard<std::mutex> lock(mu_);
    saves.swap(saves_);
  }
  for (auto& [key, save] : saves) save.wait();
}

void BackgroundSaves::Start(const std::string& key, ShardSnapshot snapshot, const std::string& path,
                            int rank, uint64_t seq) {
  // A save into the same directory that was never awaited (its checkpoint
  // failed elsewhere) must finish before a new one writes there.
  std::shared_future<v1::CommandResult> previous;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = saves_.find(key); it != saves_.end()) {
      previous = it->second;
      saves_.erase(it);
    }
  }
  if (previous.valid()) previous.wait();
  std::shared_future<v1::CommandResult> save =
      std::async(std::launch::async, [snapshot = std::move(snapshot), path, rank, seq]() {
        absl::StatusOr<ShardSaveResult> written = WriteShardSnapshot(snapshot, path);
        if (!written.ok()) {  // a gather failed: report it like a file error
          written = ShardSaveResult{{}, written.status()};
        }
        v1::CommandResult result;
        result.set_seq(seq);
        result.set_rank(rank);
        if (!written->write_status.ok()) {
          result.set_error_code(static_cast<int>(written->write_status.code()));
          result.set_error(std::string(written->write_status.message()));
        }
        for (const CheckpointFile& f : written->files) {
          v1::CheckpointFileInfo* info = result.add_files();
          info->set_name(f.name);
          info->set_rank(f.rank);
          info->set_bytes(static_cast<int64_t>(f.bytes));
          info->set_xxh3(f.xxh3);
        }
        return result;
      }).share();
  std::lock_guard<std::mutex> lock(mu_);
  saves_[key] = std::move(save);
}

absl::StatusOr<v1::CommandResult> BackgroundSaves::Await(const std::string& key,
                                                         absl::Time deadline) {
  std::shared_future<v1::CommandResult> save;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = saves_.find(key);
    if (it == saves_.end()) {
      return absl::NotFoundError(absl::StrCat("no async save into '", key, "' on this worker"));
    }
    save = it->second;
  }
  const auto wait = std::chrono::microseconds(
      std::max<int64_t>(0, absl::ToInt64Microseconds(deadline - absl::Now())));
  if (save.wait_for(wait) != std::future_status::ready) {
    return absl::DeadlineExceededError(absl::StrCat("async save into '", key, "' still writing"));
  }
  v1::CommandResult result = save.get();
  std::lock_guard<std::mutex> lock(mu_);
  saves_.erase(key);
  return result;
}

}  // namespace flatshard
