// TrainingJob's checkpoint saves (docs/architecture.md §6): the coordinator's half
// of the two-phase commit, and checkpoints requested during Train. Loading is
// in training_job_load.cc.
#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "rpc/checkpoint_file_proto.h"
#include "rpc/status_proto.h"
#include "spdlog/spdlog.h"

#include "coordinator/training_job.h"
#include "core/optimizer.h"
#include "core/status_macros.h"
#include "core/status_payloads.h"

namespace flatshard {

struct TrainingJob::PendingSave {
  std::string name;
  v1::StateDictType type;
  bool async_save = false;
  // Set once the save's collectives ran (between two steps).
  std::promise<SaveFuture> started;
};

namespace {

std::shared_future<absl::StatusOr<v1::CheckpointInfo>> Ready(
    absl::StatusOr<v1::CheckpointInfo> result) {
  std::promise<absl::StatusOr<v1::CheckpointInfo>> promise;
  promise.set_value(std::move(result));
  return promise.get_future().share();
}

}  // namespace

v1::StateDictType TrainingJob::ResolveStateDictType(
    const std::optional<v1::StateDictSettings>& settings) const {
  v1::StateDictType type;
  {
    std::lock_guard<std::mutex> lock(mu_);
    type = settings.has_value() ? settings->state_dict_type()
                                : spec_.state_dict_settings().state_dict_type();
  }
  if (type == v1::STATE_DICT_TYPE_UNSPECIFIED) type = v1::FULL_STATE_DICT;
  // FSDP: NO_SHARD always behaves as FULL (docs/fsdp-semantics.md §5.1).
  if (!IsSharded(EffectiveStrategy(config_.sharding.strategy, world_size())) &&
      type != v1::FULL_STATE_DICT) {
    spdlog::warn("job {}: {} with a non-sharded strategy is saved as FULL_STATE_DICT", name(),
                 std::string(StateDictTypeName(type)));
    type = v1::FULL_STATE_DICT;
  }
  return type;
}

absl::StatusOr<v1::CheckpointInfo> TrainingJob::SaveCheckpoint(
    const std::string& requested, const std::optional<v1::StateDictSettings>& settings,
    bool async_save, const std::function<void()>& on_snapshot) {
  if (settings.has_value() && !v1::StateDictType_IsValid(settings->state_dict_type())) {
    return absl::InvalidArgumentError(
        absl::StrCat("settings.state_dict_type has unknown value ", settings->state_dict_type()));
  }
  if (!requested.empty()) RETURN_IF_ERROR(ValidateCheckpointName(requested));
  const v1::StateDictType type = ResolveStateDictType(settings);
  SaveFuture done;
  absl::StatusOr<OperationLock> op = BeginOperation("save a checkpoint");
  if (op.ok()) {
    // Named once an async save before it has committed: its name is taken then.
    if (requested.empty() && committer_.joinable()) committer_.join();
    const std::string name = requested.empty() ? StepCheckpointName(StepNow()) : requested;
    done = StartSave(name, type, /*scheduled=*/false, async_save);
    op->unlock();  // an async save's writing and commit need no operation slot
  } else {
    std::future<SaveFuture> started;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!training_) return op.status();
      // Each waits with its own RPC and runs between two steps: a bound keeps
      // clients from stacking more saves than training can make room for.
      constexpr size_t kMaxQueuedSaves = 8;
      if (pending_saves_.size() >= kMaxQueuedSaves) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "job '", config_.name, "' already has ", pending_saves_.size(),
            " checkpoint saves queued behind its training (the limit); try again after a step"));
      }
      auto pending = std::make_shared<PendingSave>();
      pending->name = requested;
      pending->type = type;
      pending->async_save = async_save;
      started = pending->started.get_future();
      pending_saves_.push_back(std::move(pending));
    }
    spdlog::info("job {}: checkpoint requested during training; it runs after the current step",
                 name());
    done = started.get();
  }
  if (async_save && on_snapshot) {
    const bool failed_early =
        done.wait_for(std::chrono::seconds(0)) == std::future_status::ready && !done.get().ok();
    if (!failed_early) on_snapshot();
  }
  return done.get();
}

void TrainingJob::RunPendingSaves(const absl::Status& refuse, bool last) {
  while (true) {
    std::shared_ptr<PendingSave> next;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (pending_saves_.empty()) {
        if (last) training_ = false;
        return;
      }
      next = pending_saves_.front();
      pending_saves_.erase(pending_saves_.begin());
    }
    if (!refuse.ok()) {
      next->started.set_value(Ready(refuse));
      continue;
    }
    if (next->name.empty()) {
      // Named once the async save before it has committed: its name is taken then.
      if (committer_.joinable()) committer_.join();
      next->name = StepCheckpointName(StepNow());
    }
    next->started.set_value(
        StartSave(next->name, next->type, /*scheduled=*/false, next->async_save));
  }
}

int64_t TrainingJob::StepNow() const {
  std::lock_guard<std::mutex> lock(mu_);
  return step_;
}

std::string TrainingJob::StepCheckpointName(int64_t step) const {
  std::string state;
  {
    std::lock_guard<std::mutex> lock(mu_);
    state = state_checkpoint_;
  }
  // Taken by another history at this step number (the job loaded an older
  // checkpoint and trained back past it): that is not this state, which is
  // saved under the next free suffix. Refusing it (or skipping a scheduled
  // save) would leave nothing to grow back or recover at but the other
  // history. A name this very state was saved as ends the search.
  std::string name = absl::StrFormat("step-%08d", step);
  for (int n = 2; name != state && catalog_.Exists(name); ++n) {
    name = absl::StrFormat("step-%08d-%d", step, n);
  }
  return name;
}

absl::Status TrainingJob::MaybeScheduledSave() {
  const v1::CheckpointSchedule& schedule = spec_.checkpoints();
  // An async save of this very step may be committing.
  if (committer_.joinable()) committer_.join();
  int64_t step = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    step = step_;
  }
  if (schedule.every_steps() <= 0 || step % schedule.every_steps() != 0) return absl::OkStatus();
  const std::string name = StepCheckpointName(step);
  {
    // Taken already by a save of this very state (an unnamed one on demand).
    std::lock_guard<std::mutex> lock(mu_);
    if (state_checkpoint_ == name) return absl::OkStatus();
  }
  std::optional<v1::StateDictSettings> settings;
  if (schedule.has_settings()) settings = schedule.settings();
  if (!schedule.async_save()) {
    return SaveNow(name, ResolveStateDictType(settings), /*scheduled=*/true).status();
  }
  // Training goes on while the files are written; the committer logs failures.
  SaveFuture started = StartSave(name, ResolveStateDictType(settings), /*scheduled=*/true, true);
  if (started.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
    return started.get().status();  // the snapshot itself failed
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::CommandResult>> TrainingJob::RunCheckpointBatch(
    const v1::CheckpointBatch& command) {
  v1::CommandBatch batch;
  *batch.mutable_checkpoint() = command;
  absl::StatusOr<std::vector<v1::CommandResult>> results = sequencer()->Run(std::move(batch));
  if (!results.ok()) {
    // The checkpoint failed either way; the job may recover for what follows.
    (void)OnBatchFailure(results.status());
    return results.status();
  }
  // The lowest rank whose part failed. It is to blame (its node cannot read
  // or write the storage, say) only if another rank's part succeeded: when
  // every part fails, the storage is at fault. Nor when its part is damaged
  // (DATA_LOSS): each rank checks only the files it reads, so a damaged
  // checkpoint fails one rank, whichever node it runs on.
  absl::Status first;
  int first_rank = -1;
  bool any_ok = false;
  for (const v1::CommandResult& r : *results) {
    absl::Status s = StatusFromProto(r.checkpoint_status());
    any_ok |= s.ok();
    if (!s.ok() && first.ok()) {
      first = std::move(s);
      first_rank = r.rank();
    }
  }
  if (first.ok()) return results;
  absl::Status failure = PrefixStatus(absl::StrCat("rank ", first_rank, ": "), first);
  return any_ok && first.code() != absl::StatusCode::kDataLoss
             ? WithFailedRank(std::move(failure), first_rank)
             : failure;
}

CheckpointManifest TrainingJob::BuildManifest(const std::string& name, v1::StateDictType type,
                                              bool scheduled) const {
  CheckpointManifest m;
  m.name = name;
  m.job = config_.name;
  {
    std::lock_guard<std::mutex> lock(mu_);
    m.job_spec = spec_;
    m.step = step_;
    m.data_position = data_position_;
  }
  m.job_spec_digest = JobSpecDigest(m.job_spec);
  m.state_dict_type = type;
  m.world_size = world_size();
  m.strategy =
      std::string(ShardingStrategyName(EffectiveStrategy(config_.sharding.strategy, m.world_size)));
  for (const Unit& unit : units_) {
    for (const UnitParam& p : unit.params) m.params[p.fqn] = {p.dtype, p.shape};
    for (const SharedParam& s : unit.shared) m.tied[s.fqn] = s.primary_fqn;
  }
  m.optimizer = std::string(OptimizerKindName(config_.optimizer.kind));
  m.optimizer_states = OptimizerStateNames(config_.optimizer);
  m.data_seed = config_.data.seed;
  m.global_batch_size = config_.data.global_batch_size;
  m.init_seed = config_.seed;
  {
    // Never before the history's start (a clock that stepped back since the
    // load would leave this save out of the history it belongs to), and
    // after every save before it: the catalog orders by it, and a clock held
    // at the start would tie them.
    std::lock_guard<std::mutex> lock(mu_);
    m.created_unix_micros = std::max({absl::ToUnixMicros(CheckpointClock()),
                                      history_.since_unix_micros, last_created_unix_micros_ + 1});
    last_created_unix_micros_ = m.created_unix_micros;
  }
  m.scheduled = scheduled;
  return m;
}

TrainingJob::SaveFuture TrainingJob::StartSave(const std::string& name, v1::StateDictType type,
                                               bool scheduled, bool async_save) {
  if (committer_.joinable()) committer_.join();  // one save's snapshot in memory at a time
  const absl::Time start = absl::Now();
  // Every way a save ends goes through here once, for the metrics.
  auto report = [this, type, start](absl::StatusOr<v1::CheckpointInfo> outcome) {
    if (options_.observer != nullptr) {
      options_.observer->OnCheckpointSave(config_.name, type, absl::Now() - start, outcome);
    }
    return outcome;
  };
  // A refused request (a bad or taken name) is the caller's error, not a
  // failed checkpoint: it is not counted.
  if (absl::Status begun = catalog_.BeginSave(name); !begun.ok()) return Ready(begun);
  v1::CheckpointBatch command;
  command.mutable_save_shard()->set_directory(catalog_.RelativePartialDir(name));
  command.mutable_save_shard()->mutable_settings()->set_state_dict_type(type);
  command.mutable_save_shard()->set_async_save(async_save);
  // The manifest describes the state at this point, whenever it is written.
  CheckpointManifest manifest = BuildManifest(name, type, scheduled);
  uint64_t generation = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation = state_generation_;
  }
  const std::shared_ptr<CommandSequencer> epoch = sequencer();
  absl::StatusOr<std::vector<v1::CommandResult>> results = RunCheckpointBatch(command);
  // An async save that a rank refused is still running on the other ranks
  // (they all joined the snapshot): the committer must collect them anyway.
  // Not when the batch failed the epoch: a recovery has replaced it, and the
  // new epoch's ranks hold no such save.
  const bool drain = async_save && !results.ok() && sequencer() == epoch && epoch->failure().ok();
  if (!results.ok() && !drain) {
    catalog_.AbandonSave(name);
    return Ready(report(absl::Status(
        results.status().code(),
        absl::StrCat("checkpoint '", name, "' was not saved: ", results.status().message()))));
  }
  const absl::Status refused = results.status();
  const int keep_last = spec_.checkpoints().keep_last();
  auto commit =
      [this, name, type, start, keep_last, report, generation](
          CheckpointManifest m,
          const std::vector<v1::CommandResult>& written) -> absl::StatusOr<v1::CheckpointInfo> {
    for (const v1::CommandResult& r : written) {
      for (const v1::CheckpointFileInfo& f : r.files()) {
        m.files.push_back(CheckpointFileFromProto(f));
      }
    }
    absl::StatusOr<v1::CheckpointInfo> info = catalog_.Commit(m, keep_last);
    if (!info.ok()) {
      catalog_.AbandonSave(name);
      return report(info.status());
    }
    NameTheState(name, generation);
    spdlog::info("job {}: saved checkpoint {} ({}, step {}, {} bytes) in {}", config_.name, name,
                 std::string(StateDictTypeName(type)), info->step(), info->bytes(),
                 absl::FormatDuration(absl::Now() - start));
    return report(std::move(info));
  };
  if (!async_save) return Ready(commit(std::move(manifest), *results));

  AsyncSave save;
  save.name = name;
  save.directory = catalog_.RelativePartialDir(name);
  // The batch ran on every rank (a refusal is a rank's checkpoint status),
  // so it is the epoch's last.
  save.batch_seq = epoch->last_seq();
  save.manifest = std::move(manifest);
  save.refused = refused;
  save.commit = commit;
  save.report = report;
  {
    std::lock_guard<std::mutex> lock(mu_);
    save.workers = clients_;
    save.ids = worker_ids_;
    save.seq = sequencer_;
  }
  auto promise = std::make_shared<std::promise<absl::StatusOr<v1::CheckpointInfo>>>();
  SaveFuture done = promise->get_future().share();
  committer_ = std::thread([this, promise, save = std::move(save)]() mutable {
    promise->set_value(CollectAsyncSave(std::move(save)));
  });
  return done;
}

}  // namespace flatshard
