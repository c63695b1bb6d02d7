// Where a job goes on when a restarted coordinator re-adopts its workers
// (docs/fault-tolerance.md, "Coordinator restarts"). Pure: the caller asks the
// ranks which seq they completed and agrees it; this says from the job's
// record and the last batch the sequencer journaled what that means, or why
// it cannot say (the job then rolls back to its last checkpoint instead).
#ifndef FLATSHARD_COORDINATOR_READOPTION_H_
#define FLATSHARD_COORDINATOR_READOPTION_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"

#include "coordinator/state_store.h"

namespace flatshard {

struct ReadoptionPoint {
  int64_t step = 0;
  int64_t data_position = 0;
  uint64_t last_seq = 0;
};

// `agreed`: the seq every rank of `record.epoch` reports as its last
// completed. The last batch ran everywhere (agreed == its seq) or nowhere
// (one less), or, when it was written ahead (BatchRecord::written_ahead), the
// step batch before it reached no rank either (two less); either way the ranks must be at a step
// boundary, since the coordinator restarts a step from its first micro-batch and a rank keeps the
// gradients of the micro-batches it ran. FAILED_PRECONDITION saying why otherwise: the ranks are
// between a step's micro-batches, a checkpoint load moved them to a step the journal does not know,
// or they are at a seq neither the journal nor the record explains.
absl::StatusOr<ReadoptionPoint> ReadoptionPointAt(const JobRecord& record,
                                                  const std::optional<BatchRecord>& last,
                                                  uint64_t agreed);

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_READOPTION_H_
