#include "client/up_signals.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>

#include <pthread.h>
#include <sys/signalfd.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace flatshard {
namespace {

int Take(const sigset_t& signals, absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) {
    for (;;) {
      const int got = sigwaitinfo(&signals, nullptr);
      if (got > 0) return got;
      if (errno != EINTR) return 0;
    }
  }
  const timespec wait = absl::ToTimespec(std::max(timeout, absl::ZeroDuration()));
  for (;;) {
    const int got = sigtimedwait(&signals, nullptr, &wait);
    if (got > 0) return got;
    // EAGAIN: none in time. EINTR (a signal outside the set, e.g. SIGSTOP's
    // SIGCONT): try again; rarely, this waits a little longer than asked.
    if (errno != EINTR) return 0;
  }
}

sigset_t UpSignals() {
  sigset_t signals = StopSignals();
  sigaddset(&signals, SIGCHLD);
  return signals;
}

}  // namespace

void BlockUpSignals() {
  const sigset_t signals = UpSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

int TakeStopSignal(absl::Duration timeout) { return Take(StopSignals(), timeout); }

int TakeUpSignal(absl::Duration timeout) { return Take(UpSignals(), timeout); }

absl::StatusOr<int> StopSignalFd() {
  const sigset_t stop_signals = StopSignals();
  const int fd = signalfd(-1, &stop_signals, SFD_CLOEXEC | SFD_NONBLOCK);
  if (fd < 0) return absl::InternalError(absl::StrCat("signalfd: ", strerror(errno)));
  return fd;
}

}  // namespace flatshard
