// A Store in a shared directory: one file per key, written to a temporary name
// and renamed into place so readers never see half a value; Add is serialised
// with flock. For tests and the standalone harness on one machine (or a shared
// filesystem); the coordinator's store replaces it in a cluster.
#ifndef FLATSHARD_WORKER_COMM_FILE_STORE_H_
#define FLATSHARD_WORKER_COMM_FILE_STORE_H_

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

 private:
  explicit FileStore(std::string directory) : directory_(std::move(directory)) {}
  std::string PathOf(const std::string& key) const;

  std::string directory_;
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_COMM_FILE_STORE_H_
