// A worker's id, stable across restarts of its daemon (docs/fault-tolerance.md):
// the coordinator keeps a worker's rank by its id, so a daemon that comes back
// after a crash must come back as itself, not as HOST-PID.
//
// The ids live in a state directory, one file per seat: "gpu-N" for a worker
// driving GPU N, else "slot-K". A daemon claims a seat by taking an exclusive
// flock on its file (released when the process dies, kill -9 included): a GPU
// worker claims its GPU's seat; a CPU worker the lowest free slot. So four
// workers on a host hold slots 0..3, and one restarted after a crash finds its
// old slot free and takes its id back. The first claimant of a seat writes a
// fresh id into it (HOST-xxxxxxxx, random), durably, with an identity secret
// (file mode 0600) that proves to the coordinator that a re-registration
// under the id comes from this seat's daemon, not from someone who read the id.
#ifndef FLATSHARD_WORKER_SERVICE_WORKER_IDENTITY_H_
#define FLATSHARD_WORKER_SERVICE_WORKER_IDENTITY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace flatshard {

class WorkerIdentity {
 public:
  static constexpr int kMaxSlots = 1024;

  // `gpu` >= 0 claims that GPU's seat; -1 the lowest free slot. Errors name
  // the directory or the file and what is wrong with it.
  static absl::StatusOr<std::unique_ptr<WorkerIdentity>> Claim(const std::string& dir,
                                                               const std::string& host, int gpu);
  ~WorkerIdentity();  // releases the seat
  WorkerIdentity(const WorkerIdentity&) = delete;
  WorkerIdentity& operator=(const WorkerIdentity&) = delete;

  const std::string& id() const { return id_; }
  const std::string& secret() const { return secret_; }
  const std::string& seat_file() const { return path_; }

 private:
  WorkerIdentity(std::string id, std::string secret, std::string path, int fd)
      : id_(std::move(id)), secret_(std::move(secret)), path_(std::move(path)), fd_(fd) {}

  std::string id_;
  std::string secret_;
  std::string path_;
  int fd_;
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_SERVICE_WORKER_IDENTITY_H_
