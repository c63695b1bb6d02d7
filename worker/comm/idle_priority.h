// Background work that must not slow training down: peer snapshot exchanges
// run at Linux's SCHED_IDLE priority, so they take only CPU time no rank's
// compute or collectives want (on a host whose ranks keep every core busy
// they would otherwise stretch each step by their whole cost).
#ifndef FLATSHARD_WORKER_COMM_IDLE_PRIORITY_H_
#define FLATSHARD_WORKER_COMM_IDLE_PRIORITY_H_

#include <functional>

#include "absl/status/status.h"

namespace flatshard {

// Moves the calling thread to SCHED_IDLE. Threads it creates afterwards
// inherit the policy (Gloo's transport loop thread, created with a
// communicator's device, among them).
absl::Status LowerThisThreadToIdlePriority();

// Runs `fn` on a new thread at SCHED_IDLE and waits for it: what a
// communicator created inside it spawns stays at that priority while the
// caller's own priority is untouched.
void RunAtIdlePriority(const std::function<void()>& fn);

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_COMM_IDLE_PRIORITY_H_
