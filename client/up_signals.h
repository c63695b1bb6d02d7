// The signals `flatshard up` takes itself instead of dying of them: SIGINT
// (Ctrl-C) and SIGTERM stop the cluster, SIGCHLD says a daemon exited. They
// are blocked in every thread (BlockUpSignals runs before any other thread
// starts, which inherit the mask; children start with an empty one) and
// taken with sigtimedwait (sigwaitinfo), so each is handled where `up` is
// ready for it.
#ifndef FLATSHARD_CLIENT_UP_SIGNALS_H_
#define FLATSHARD_CLIENT_UP_SIGNALS_H_

#include <csignal>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rpc/stop_signals.h"  // StopSignals()

namespace flatshard {

// Blocks the stop signals and SIGCHLD in the calling thread.
void BlockUpSignals();

// Takes a stop signal, waiting up to `timeout` for one (zero: only one
// already pending; infinite: until one comes); 0 when none came.
int TakeStopSignal(absl::Duration timeout);

// Takes a stop signal or SIGCHLD, as TakeStopSignal; 0 when none came.
int TakeUpSignal(absl::Duration timeout);

// A signalfd that is readable while a stop signal is pending, for a wait
// that must end on Ctrl-C (LocalClusterOptions::interrupt_fd). Nothing reads
// it: the signal stays pending for TakeStopSignal. Close-on-exec.
absl::StatusOr<int> StopSignalFd();

}  // namespace flatshard

#endif  // FLATSHARD_CLIENT_UP_SIGNALS_H_
