// A Store in a shared directory: one file per key, written to a temporary name
// and renamed into place so readers never see half a value; Add is serialised
// with flock. For tests and the standalone harness on one machine (or a shared
// filesystem); the coordinator's store replaces it in a cluster. Waits poll,
// so Abort ends them within a poll interval (20 ms at most).
#ifndef FLATSHARD_WORKER_COMM_FILE_STORE_H_
#define FLATSHARD_WORKER_COMM_FILE_STORE_H_

#include <mutex>
#include <optional>
#include <string>

#include "worker/comm/store.h"

namespace flatshard {

class FileStore : public Store {
 public:
  // `directory` is created if missing.
  static absl::StatusOr<std::shared_ptr<FileStore>> Open(const std::string& directory);

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;
  void Abort(const std::string& reason) override;

 private:
  explicit FileStore(std::string directory) : directory_(std::move(directory)) {}
  std::string PathOf(const std::string& key) const;
  // ABORTED naming the reason once Abort was called; OK before.
  absl::Status AbortedStatus() const;

  std::string directory_;
  mutable std::mutex mu_;
  std::optional<std::string> aborted_;  // the reason, once aborted
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_COMM_FILE_STORE_H_
