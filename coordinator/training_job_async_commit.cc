// The background half of an async save (TrainingJob::CollectAsyncSave): the
// committer thread awaits every rank's write of the snapshot the save batch
// took, then commits the checkpoint or abandons it.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

#include "coordinator/async_save_await.h"
#include "coordinator/training_job.h"
#include "core/status_payloads.h"

namespace flatshard {

absl::StatusOr<v1::CheckpointInfo> TrainingJob::CollectAsyncSave(AsyncSave save) {
  // Every rank is awaited, all at once, even after one failed: each holds a
  // snapshot until its outcome is collected (SettleAsyncSave says whom a
  // failure blames). A rank whose write stands still for the stall timeout
  // is failed as a stalled batch's rank is: its epoch is recovered, whose
  // abort watches the stuck write (its daemon ends itself after its grace),
  // instead of the commit waiting out the batch timeout and the write
  // holding its snapshot until the next save stops on it.
  const absl::Time deadline = absl::Now() + options_.batch.timeout;  // one for all ranks
  const std::shared_ptr<CommandSequencer>& seq = save.seq;
  // The job failed meanwhile: its recovery re-forms the ranks (dropping
  // their snapshots); waiting on them could only hang on a stopped one.
  const auto job_failed = [&seq] { return seq != nullptr && !seq->failure().ok(); };
  // A stalled write's rank is failed at once (on this thread, while the
  // other waits run on), unless the job failed meanwhile for its own cause.
  absl::Status stalled;
  AwaitedSaves awaited = AwaitAsyncSaves(
      save.workers, save.directory, deadline, options_.batch.stall_timeout, job_failed,
      [&](int rank, const AwaitedSave& stuck) {
        if (job_failed()) return;
        const auto r = static_cast<size_t>(rank);
        const absl::Status reason(stuck.result.status().code(),
                                  absl::StrCat("its worker's (", save.workers[r]->address(), ") ",
                                               stuck.result.status().message()));
        stalled = PrefixStatus(absl::StrCat("rank ", rank, ": "), reason);
        if (seq != nullptr && seq == sequencer()) (void)FailRank(rank, save.ids[r], reason);
      });
  absl::StatusOr<std::vector<v1::CommandResult>> written =
      SettleAsyncSave(std::move(awaited), save.batch_seq, save.refused, stalled,
                      seq != nullptr ? seq->failure() : absl::OkStatus());
  if (!written.ok()) {
    const absl::Status& failed = written.status();
    catalog_.AbandonSave(save.name);
    spdlog::error("job {}: async checkpoint {} failed: {}", config_.name, save.name,
                  std::string(failed.message()));
    return save.report(absl::Status(
        failed.code(),
        absl::StrCat("checkpoint '", save.name, "' was not saved: ", failed.message())));
  }
  return save.commit(std::move(save.manifest), *written);
}

}  // namespace flatshard
