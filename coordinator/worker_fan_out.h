// One call to each of many workers, all in flight at once, with no thread
// per worker: each call is started asynchronously, then the caller waits once
// for every answer. An abort or a probe then costs one round trip (or, for a
// dead worker, one timeout) whatever the world size, and holds one thread:
// at 16,384 workers a thread per call was 16,384 threads for one abort
// (docs/performance.md, the coordinator at scale).
#ifndef FLATSHARD_COORDINATOR_WORKER_FAN_OUT_H_
#define FLATSHARD_COORDINATOR_WORKER_FAN_OUT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

#include "coordinator/worker_client.h"
#include "flatshard/v1/worker.pb.h"

namespace flatshard {

// How long an epoch's first call gives a worker's channel to connect: a
// worker that has just registered can miss its first connection attempt on a
// busy host, and a fail-fast call would turn that into a failed job; a dead
// worker costs this much, not the configure timeout.
inline constexpr absl::Duration kConnectGrace = absl::Seconds(2);

// What each call of a fan-out adds to the time the whole burst needs: the
// coordinator makes, sends, receives and retires every call, one per worker,
// before the last answer can be read. bench/fan_out_bench.cc measured up to
// 0.18 ms of the coordinator's CPU a call on connected channels, and 0.7 ms on
// channels that must connect first, at 1,024 to 16,384 workers (2 cores
// shared with the servers; bench/RESULTS.md, "Abseil's deadlock detector at
// 16,384 channels"); the slowest fan-out of 16,384 took 38 % of its deadline.
// A fixed deadline read healthy workers as unreachable at scale: a fixed 2 s
// connect grace failed 13,821 of 16,384 configures there. The allowances were
// twice these until Abseil's deadlock detector, left on by Debian's build,
// was found to be most of that CPU (rpc/mutex_deadlock_detection.h); a dead
// worker's verdict at 16,384 now takes 18 s, not 35.
inline constexpr absl::Duration kFanOutAllowancePerCall = absl::Milliseconds(1);
inline constexpr absl::Duration kConnectAllowancePerCall = absl::Milliseconds(2);

// Whether a fan-out's channels are connected already (the sequencer's, a
// save's), or new and must connect first (a formation's, a restarted
// coordinator's, a returning worker's): a connect costs about 4x a call.
enum class FanOutChannels { kConnected, kConnecting };

// The time to give a fan-out of `calls` calls whose single call is given
// `one`: `one` plus the allowance for every call after the first.
absl::Duration FanOutTimeout(absl::Duration one, size_t calls,
                             FanOutChannels channels = FanOutChannels::kConnected);

// Configures worker i with requests[i], all at once: the ranks rendezvous, so
// every call is held until the last rank has arrived. Each channel may take
// FanOutTimeout(kConnectGrace, workers, kConnecting) to connect. `failed`, when set,
// runs for each failure as it comes in (on any thread, this one included,
// with nothing of the fan-out's locked), so that the caller can cancel the
// others at once instead of letting them wait for the rank that will never
// arrive. `abandoned`, when set, says the caller has given up for another
// cause (a stop, a silent worker). After either, a worker not yet started is
// not started at all, and reads CANCELLED; one started while the caller gave
// up is cancelled here (the caller's cancel may have come before its call
// was registered). Each one's outcome, by position.
std::vector<absl::Status> ConfigureAll(
    absl::Span<WorkerClient* const> workers, std::vector<v1::ConfigureRequest> requests,
    absl::Time deadline, const std::function<void(size_t, const absl::Status&)>& failed,
    const std::function<bool()>& abandoned = {});

// Every worker's GetStatus answer (or its error), by position in `workers`.
std::vector<absl::StatusOr<v1::GetStatusResponse>> GetStatusAll(
    absl::Span<WorkerClient* const> workers, absl::Time deadline);

// Aborts `epoch` on every worker; each one's outcome, by position.
std::vector<absl::Status> AbortAll(absl::Span<WorkerClient* const> workers, uint64_t epoch,
                                   const std::string& reason, absl::Time deadline);

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_WORKER_FAN_OUT_H_
