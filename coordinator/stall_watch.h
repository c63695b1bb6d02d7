// Which ranks of a batch are stalled (docs/fault-tolerance.md, "Stalled
// ranks"): once some rank has finished a batch, the sequencer asks each rank
// still running it for its progress counter (GetStatusResponse.progress),
// and a rank whose counter has stayed still for the stall timeout is stuck:
// a write into a hung mount, a deadlock, nothing a peer's collective or the
// heartbeats would notice before the batch timeout. Waiting does not move
// the counter, but a rank that finished waits for nobody, so a straggler
// that is still is not waiting for a peer either. Logic only: the caller
// probes and passes the time in, on a steady clock (a wall clock stepped
// forward would make a counter look still for longer than it was).
#ifndef FLATSHARD_COORDINATOR_STALL_WATCH_H_
#define FLATSHARD_COORDINATOR_STALL_WATCH_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace flatshard {

class StallWatch {
 public:
  using Clock = std::chrono::steady_clock;

  // `timeout` > 0.
  explicit StallWatch(absl::Duration timeout) : timeout_(timeout) {}

  // Only the ranks in `running` (ascending) are watched from now on: the
  // others have answered their batch.
  void Retain(const std::vector<int>& running);
  // Rank `rank`'s counter as read at `now`; nullopt when it did not answer
  // (that moves nothing: a process that cannot answer is not progressing).
  // The first reading of a rank starts its clock.
  void Observe(int rank, std::optional<uint64_t> progress, Clock::time_point now);

  struct Stall {
    int rank;
    absl::Duration still_for;
    std::optional<uint64_t> progress;  // its last reading; nullopt: never read
  };
  // The rank still the longest (ties: the lowest), if that is at least the
  // timeout.
  std::optional<Stall> Stalled(Clock::time_point now) const;

  absl::Duration timeout() const { return timeout_; }
  // How often to probe: often enough that a stall is seen within about a
  // tenth of the timeout after it is due, never more than every 10 ms, nor
  // less than every 2 s.
  absl::Duration probe_interval() const;

 private:
  struct Reading {
    std::optional<uint64_t> progress;
    Clock::time_point since;  // when it last changed, or was first read
  };
  const absl::Duration timeout_;
  std::map<int, Reading> ranks_;
};

// "made no progress for 5.013s (its <counter> stayed at 192)", or "(it did
// not answer its progress probes)" when it was never read: the stall as an
// error message says it.
std::string DescribeStall(const StallWatch::Stall& stall, absl::string_view counter);

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_STALL_WATCH_H_
