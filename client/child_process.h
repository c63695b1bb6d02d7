// A child process that `flatshard up` (and the end-to-end tests) start: a
// daemon whose first stdout line says it is ready, stopped with SIGTERM and a
// grace period, killed if it will not go. Children die with their parent
// (PR_SET_PDEATHSIG), so a crashed `up` leaves nothing behind.
#ifndef FLATSHARD_CLIENT_CHILD_PROCESS_H_
#define FLATSHARD_CLIENT_CHILD_PROCESS_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <sys/types.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace flatshard {

class ChildProcess {
 public:
  // Runs argv[0] (a path) with the rest as arguments, in a process group of
  // its own (SIGTERM when we die); its stdout comes to us (ReadLine), its
  // stderr is ours.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Spawn(const std::vector<std::string>& argv);
  ~ChildProcess();  // Terminate(10 s) if still running

  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }

  // The next line the child writes to stdout, without the newline.
  // DEADLINE_EXCEEDED after `timeout`; UNAVAILABLE when the child closed
  // stdout (it exited) first; CANCELLED once `interrupt_fd` (when not -1)
  // is readable: `flatshard up`'s signalfd while a Ctrl-C is pending, so
  // that a user need not wait out a daemon's start.
  absl::StatusOr<std::string> ReadLine(absl::Duration timeout, int interrupt_fd = -1);

  // Waits up to `timeout` for the child to exit; its wait status, or nullopt.
  std::optional<int> Wait(absl::Duration timeout);
  // SIGTERM (and SIGCONT, so that a stopped child acts on it, as systemd
  // does), then SIGKILL after `grace`; the wait status.
  int Terminate(absl::Duration grace);
  void Signal(int signal);
  // SIGKILL now. Unlike the rest, callable from another thread while one
  // waits for the child: it goes through the pidfd, which names this child
  // even after it was reaped and its pid given to another process (without
  // a pidfd, a kernel before 5.3, it does nothing).
  void Kill() const;
  // Whether a SIGKILL from Terminate() or Kill() is what ended it (not a
  // child that had exited already); on the thread that waits for it.
  bool killed() const;

 private:
  ChildProcess(pid_t pid, int stdout_fd, int pid_fd, std::string name)
      : pid_(pid), stdout_fd_(stdout_fd), pid_fd_(pid_fd), name_(std::move(name)) {}

  pid_t pid_;
  int stdout_fd_;
  int pid_fd_;  // pidfd: poll()able for exit, so waiting needs no sleeps
  std::string name_;
  std::string buffered_;
  std::optional<int> status_;
  mutable std::atomic<bool> killed_{false};
};

}  // namespace flatshard

#endif  // FLATSHARD_CLIENT_CHILD_PROCESS_H_
