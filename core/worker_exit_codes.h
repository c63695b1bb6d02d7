// The worker daemon's exit statuses that its supervisors act on: the daemon
// (worker/worker_main.cc) exits with them, and `flatshard up`, the Slurm
// script and the tests tell them apart from a crash.
#ifndef FLATSHARD_CORE_WORKER_EXIT_CODES_H_
#define FLATSHARD_CORE_WORKER_EXIT_CODES_H_

namespace flatshard {

// The worker ended itself because aborted work did not return within its
// grace (worker/service/abort_watchdog.h): it holds nothing any more, and a
// supervisor starts it again under the same id.
inline constexpr int kWedgedExitCode = 3;

}  // namespace flatshard

#endif  // FLATSHARD_CORE_WORKER_EXIT_CODES_H_
