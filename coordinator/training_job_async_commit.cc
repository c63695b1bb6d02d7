// The background half of an async save (TrainingJob::CollectAsyncSave): the
// committer thread awaits every rank's write of the snapshot the save batch
// took, then commits the checkpoint or abandons it.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "rpc/status_proto.h"
#include "spdlog/spdlog.h"

#include "coordinator/async_save_await.h"
#include "coordinator/failed_rank.h"
#include "coordinator/training_job.h"

namespace flatshard {

absl::StatusOr<v1::CheckpointInfo> TrainingJob::CollectAsyncSave(AsyncSave save) {
  std::vector<v1::CommandResult> written;
  // Every rank is awaited, even after one failed: each holds a snapshot
  // until its outcome is collected. A rank that cannot be reached is the
  // cause; the others then only report that their job lost it.
  // A rank whose process is gone (UNAVAILABLE) is blamed before one that
  // answers but lost its save (its job was aborted because of the first).
  // A rank whose write stands still for the stall timeout is failed as a
  // stalled batch's rank is: its epoch is recovered, whose abort watches
  // the stuck write (its daemon ends itself after its grace), instead of
  // the commit waiting out the batch timeout and the write holding its
  // snapshot until the next save stops on it.
  absl::Status unreachable, stalled, lost, reported = save.refused;
  const absl::Time deadline = absl::Now() + options_.batch.timeout;  // one for all ranks
  const std::shared_ptr<CommandSequencer>& seq = save.seq;
  // The job failed meanwhile: its recovery re-forms the ranks (dropping
  // their snapshots); waiting on them could only hang on a stopped one.
  const auto job_failed = [&seq] { return seq != nullptr && !seq->failure().ok(); };
  for (size_t r = 0; r < save.workers.size(); ++r) {
    if (job_failed()) break;
    WorkerClient& worker = *save.workers[r];
    const int rank = static_cast<int>(r);
    AwaitedSave awaited = AwaitAsyncSave(worker, rank, save.directory, deadline,
                                         options_.batch.stall_timeout, job_failed);
    if (awaited.stall.has_value()) {
      if (job_failed()) break;  // meanwhile, for its own cause
      const absl::Status reason(awaited.result.status().code(),
                                absl::StrCat("its worker's (", worker.address(), ") ",
                                             awaited.result.status().message()));
      stalled = PrefixStatus(absl::StrCat("rank ", r, ": "), reason);
      if (seq != nullptr && seq == sequencer()) (void)FailRank(rank, save.ids[r], reason);
      break;
    }
    absl::StatusOr<v1::CommandResult> result = std::move(awaited.result);
    // An outcome stays on the worker until its next save: one of an earlier
    // save into the same directory (a failed save's name taken again, on a
    // rank that refused this one's batch) is not this save's.
    if (result.ok() && result->seq() != save.batch_seq) {
      result = absl::FailedPreconditionError(
          absl::StrCat("its answer is for batch seq ", result->seq(), ", not ", save.batch_seq));
    }
    if (!result.ok()) {
      const bool gone = result.status().code() == absl::StatusCode::kUnavailable;
      absl::Status& slot = gone ? unreachable : lost;
      if (slot.ok()) {
        slot = absl::Status(
            result.status().code(),
            absl::StrCat("rank ", r, " did not finish its write: ", result.status().message()));
      }
    } else if (absl::Status s = StatusFromProto(result->checkpoint_status()); !s.ok()) {
      if (reported.ok()) {
        reported = absl::Status(s.code(), absl::StrCat("rank ", r, ": ", s.message()));
      }
    } else {
      written.push_back(*std::move(result));
    }
  }
  // The job failing meanwhile names the rank it lost (its sequencer's
  // failure); a rank that only lost its save because of that is not it.
  const absl::Status job_failure = seq != nullptr ? seq->failure() : absl::OkStatus();
  const absl::Status failed = !unreachable.ok()   ? unreachable
                              : !stalled.ok()     ? stalled
                              : !job_failure.ok() ? job_failure
                              : !lost.ok()        ? lost
                                                  : reported;
  if (!failed.ok()) {
    catalog_.AbandonSave(save.name);
    spdlog::error("job {}: async checkpoint {} failed: {}", config_.name, save.name,
                  std::string(failed.message()));
    return save.report(absl::Status(
        failed.code(),
        absl::StrCat("checkpoint '", save.name, "' was not saved: ", failed.message())));
  }
  return save.commit(std::move(save.manifest), written);
}

}  // namespace flatshard
