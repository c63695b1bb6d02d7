#include "worker/comm/background_priority.h"

#include <cerrno>
#include <cstring>
#include <thread>

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace flatshard {

absl::Status LowerThisThreadToBackgroundPriority() {
  // On Linux the nice value belongs to the thread: PRIO_PROCESS with a thread
  // id sets only this one.
  const auto tid = static_cast<id_t>(syscall(SYS_gettid));
  if (setpriority(PRIO_PROCESS, tid, kBackgroundNice) != 0) {
    return absl::InternalError(
        absl::StrCat("setpriority(", kBackgroundNice, "): ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

void RunAtBackgroundPriority(const std::function<void()>& fn) {
  std::thread background([&] {
    // Should it fail, the work still runs, only at normal priority.
    (void)LowerThisThreadToBackgroundPriority();
    fn();
  });
  background.join();
}

}  // namespace flatshard
