// Background work that must not slow training down much but must still finish
// within about a step: peer snapshot exchanges run at nice 10. Measured on a
// host whose ranks keep every core busy (bench/RESULTS.md "In-memory peer
// snapshots"): at normal priority the exchange stretched each step by 25%; at
// SCHED_IDLE by 12% but it starved until the next snapshot forced it, so a
// failure lost two steps; at nice 10 by 12% and it completes within the step.
#ifndef FLATSHARD_WORKER_COMM_BACKGROUND_PRIORITY_H_
#define FLATSHARD_WORKER_COMM_BACKGROUND_PRIORITY_H_

#include <functional>

#include "absl/status/status.h"

namespace flatshard {

inline constexpr int kBackgroundNice = 10;

// Lowers the calling thread to kBackgroundNice. Threads it creates afterwards
// inherit it (Gloo's transport loop thread, created with a communicator's
// device, among them). Lowering one's own priority needs no privilege.
absl::Status LowerThisThreadToBackgroundPriority();

// Runs `fn` on a new thread at background priority and waits for it: what a
// communicator created inside it spawns keeps that priority while the
// caller's own stays as it was.
void RunAtBackgroundPriority(const std::function<void()>& fn);

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_COMM_BACKGROUND_PRIORITY_H_
