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
//
// A daemon given its id (--worker-id) claims that id's seat, "id-<id>": it
// keeps only the secret, so the daemon restarted under the id proves it is
// the same one and takes its registration back at once, rather than being
// refused until the old one has missed heartbeats for the coordinator's
// timeout (docs/fault-tolerance.md, "Stable worker ids").
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
  // The seat of the given id; FAILED_PRECONDITION while another live daemon
  // on this state dir holds it.
  static absl::StatusOr<std::unique_ptr<WorkerIdentity>> ClaimId(const std::string& dir,
                                                                 const std::string& id);
  ~WorkerIdentity();  // releases the seat
  WorkerIdentity(const WorkerIdentity&) = delete;
  WorkerIdentity& operator=(const WorkerIdentity&) = delete;

  const std::string& id() const { return id_; }
  const std::string& secret() const { return secret_; }
  const std::string& seat_file() const { return path_; }

 private:
  WorkerIdentity(std::string id, std::string secret, std::string path, int fd)
      : id_(std::move(id)), secret_(std::move(secret)), path_(std::move(path)), fd_(fd) {}
  // Locks the seat file `path` and reads it (writing a fresh id, or `id`,
  // and a secret into a new one); nullptr when a live daemon holds it.
  static absl::StatusOr<std::unique_ptr<WorkerIdentity>> TakeSeat(const std::string& dir,
                                                                  const std::string& path,
                                                                  const std::string& host,
                                                                  const std::string& id);

  std::string id_;
  std::string secret_;
  std::string path_;
  int fd_;
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_SERVICE_WORKER_IDENTITY_H_
