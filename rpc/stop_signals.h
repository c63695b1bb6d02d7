// How both daemons hear that they should stop: SIGTERM (a supervisor, an
// orchestrator) or SIGINT, taken by sigwait on the main thread.
#ifndef FLATSHARD_RPC_STOP_SIGNALS_H_
#define FLATSHARD_RPC_STOP_SIGNALS_H_

#include <csignal>

namespace flatshard {

// SIGTERM and SIGINT.
sigset_t StopSignals();

// Blocks SIGTERM and SIGINT in the calling thread and returns that set, for
// sigwait. Call it before any thread starts: threads inherit the mask of
// the thread that starts them, and one that did not block them would take a
// signal with its default action (killed).
//
// A daemon started with them ignored (a shell runs a background command
// with SIGINT ignored) still hears them: Linux queues a blocked signal
// whatever its action, so sigwait returns it.
sigset_t BlockStopSignals();

}  // namespace flatshard

#endif  // FLATSHARD_RPC_STOP_SIGNALS_H_
