#include "worker/comm/idle_priority.h"

#include <sched.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"

namespace flatshard {

absl::Status LowerThisThreadToIdlePriority() {
  sched_param param{};
  param.sched_priority = 0;
  // pid 0: the calling thread (Linux scheduling attributes are per thread).
  if (sched_setscheduler(0, SCHED_IDLE, &param) != 0) {
    return absl::InternalError(absl::StrCat("sched_setscheduler(SCHED_IDLE): ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

void RunAtIdlePriority(const std::function<void()>& fn) {
  std::thread idle([&] {
    // Lowering one's own priority needs no privilege; should it fail anyway,
    // the work still runs, only at normal priority.
    (void)LowerThisThreadToIdlePriority();
    fn();
  });
  idle.join();
}

}  // namespace flatshard
