#include "client/child_process.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstring>
#include <filesystem>

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace flatshard {
namespace {

int PollMillis(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  if (left >= absl::Milliseconds(INT_MAX - 1)) return -1;  // no deadline (or none in 24 days)
  return static_cast<int>(absl::ToInt64Milliseconds(left)) + 1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Spawn(
    const std::vector<std::string>& argv) {
  if (argv.empty()) return absl::InvalidArgumentError("spawn: empty command");
  if (access(argv[0].c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("cannot run '", argv[0], "': ", strerror(errno)));
  }
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);
    // A process group of its own: a terminal's Ctrl-C reaches the parent
    // alone, which stops its children in order (`flatshard up` saves the
    // job first) instead of every daemon stopping at once.
    setpgid(0, 0);
    dup2(pipe_fds[1], STDOUT_FILENO);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(pipe_fds[1]);
  const int pid_fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  return std::unique_ptr<ChildProcess>(new ChildProcess(
      pid, pipe_fds[0], pid_fd, std::filesystem::path(argv[0]).filename().string()));
}

ChildProcess::~ChildProcess() {
  if (!status_.has_value()) Terminate(absl::Seconds(10));
  close(stdout_fd_);
  if (pid_fd_ >= 0) close(pid_fd_);
}

absl::StatusOr<std::string> ChildProcess::ReadLine(absl::Duration timeout, int interrupt_fd) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    const size_t newline = buffered_.find('\n');
    if (newline != std::string::npos) {
      std::string line = buffered_.substr(0, newline);
      buffered_.erase(0, newline + 1);
      return line;
    }
    // A line already written wins over an interrupt that came with it.
    pollfd p[2] = {{stdout_fd_, POLLIN, 0}, {interrupt_fd, POLLIN, 0}};
    const int ready = poll(p, interrupt_fd >= 0 ? 2 : 1, PollMillis(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return absl::InternalError(absl::StrCat("poll: ", strerror(errno)));
    if (ready == 0) {
      return absl::DeadlineExceededError(absl::StrCat(name_, " (pid ", pid_, ") wrote no line in ",
                                                      absl::FormatDuration(timeout)));
    }
    if (p[0].revents == 0) {
      return absl::CancelledError(
          absl::StrCat("interrupted while waiting for ", name_, " (pid ", pid_, ") to start"));
    }
    char chunk[4096];
    const ssize_t n = read(stdout_fd_, chunk, sizeof(chunk));
    if (n <= 0) {
      return absl::UnavailableError(
          absl::StrCat(name_, " (pid ", pid_, ") exited before it was ready"));
    }
    buffered_.append(chunk, static_cast<size_t>(n));
  }
}

std::optional<int> ChildProcess::Wait(absl::Duration timeout) {
  if (status_.has_value()) return status_;
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t done = waitpid(pid_, &status, WNOHANG);
    if (done == pid_) {
      status_ = status;
      return status_;
    }
    if (done < 0 && errno != EINTR) {
      status_ = -1;
      return status_;
    }
    if (absl::Now() >= deadline) return std::nullopt;
    // The pidfd becomes readable when the child exits. Without one (a
    // kernel before 5.3) nothing does: look again every 100 ms.
    pollfd p{pid_fd_, POLLIN, 0};
    const int millis = PollMillis(deadline);
    poll(&p, 1, pid_fd_ >= 0 ? millis : (millis < 0 ? 100 : std::min(millis, 100)));
  }
}

void ChildProcess::Signal(int signal) {
  if (!status_.has_value()) kill(pid_, signal);
}

void ChildProcess::Kill() const {
  // Best effort, as a Ctrl-C that will not wait is: the child may be gone.
  // Without a pidfd (a kernel before 5.3) nothing: kill() of the pid could
  // reach another process once the waiting thread has reaped this one.
  if (pid_fd_ >= 0 && syscall(SYS_pidfd_send_signal, pid_fd_, SIGKILL, nullptr, 0) == 0) {
    killed_.store(true);
  }
}

bool ChildProcess::killed() const {
  return killed_.load() && status_.has_value() && WIFSIGNALED(*status_) &&
         WTERMSIG(*status_) == SIGKILL;
}

int ChildProcess::Terminate(absl::Duration grace) {
  Signal(SIGTERM);
  Signal(SIGCONT);
  if (std::optional<int> status = Wait(grace)) return *status;
  Signal(SIGKILL);
  killed_.store(true);
  return Wait(absl::InfiniteDuration()).value_or(-1);
}

}  // namespace flatshard
