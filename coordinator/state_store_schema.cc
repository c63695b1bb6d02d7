// The state store's schema: the migrations that build it, one version at a
// time, and the step that brings an older --state-dir up to this build's.
#include <iterator>
#include <mutex>

#include <sqlite3.h>

#include "absl/strings/str_cat.h"

#include "coordinator/sqlite_statement.h"
#include "coordinator/state_store.h"
#include "core/status_macros.h"

namespace flatshard {
namespace {

// Migration i (1-based) takes the schema from version i-1 to i. Append only:
// a released migration never changes.
constexpr const char* kMigrations[] = {
    R"sql(
CREATE TABLE jobs(
  name TEXT PRIMARY KEY,
  spec BLOB NOT NULL,
  state TEXT NOT NULL,
  failure TEXT NOT NULL,
  epoch INTEGER NOT NULL,
  step INTEGER NOT NULL,
  data_position INTEGER NOT NULL,
  last_seq INTEGER NOT NULL,
  restarts INTEGER NOT NULL,
  world_size INTEGER NOT NULL,
  last_recovery BLOB,
  updated_at REAL NOT NULL);
CREATE TABLE job_members(
  job TEXT NOT NULL REFERENCES jobs(name) ON DELETE CASCADE,
  rank INTEGER NOT NULL,
  worker_id TEXT NOT NULL,
  PRIMARY KEY(job, rank));
CREATE TABLE last_batches(
  job TEXT PRIMARY KEY REFERENCES jobs(name) ON DELETE CASCADE,
  epoch INTEGER NOT NULL,
  seq INTEGER NOT NULL,
  batch BLOB NOT NULL,
  step_after INTEGER NOT NULL,
  data_position_after INTEGER NOT NULL);
CREATE TABLE operations(
  job TEXT PRIMARY KEY REFERENCES jobs(name) ON DELETE CASCADE,
  target_step INTEGER NOT NULL,
  micro_steps INTEGER NOT NULL,
  started_by TEXT NOT NULL,
  started_at REAL NOT NULL);
CREATE TABLE checkpoints(
  job TEXT NOT NULL REFERENCES jobs(name) ON DELETE CASCADE,
  name TEXT NOT NULL,
  step INTEGER NOT NULL,
  state_dict_type TEXT NOT NULL,
  world_size INTEGER NOT NULL,
  bytes INTEGER NOT NULL,
  latest INTEGER NOT NULL,
  PRIMARY KEY(job, name));
CREATE TABLE workers(
  worker_id TEXT PRIMARY KEY,
  host TEXT NOT NULL,
  device TEXT NOT NULL,
  device_name TEXT NOT NULL,
  address TEXT NOT NULL,
  rank INTEGER NOT NULL,
  metrics_address TEXT NOT NULL);
)sql",
    // 2: the SHA-256 of each worker's identity secret, so a restarted
    // coordinator still refuses a takeover of a live worker's id.
    R"sql(
ALTER TABLE workers ADD COLUMN identity_sha256 TEXT NOT NULL DEFAULT '';
)sql",
    // 3: whether the ranks held a step's earlier no_sync micro-batches when
    // the last batch was sent, so a restart re-adopts only at a step boundary.
    R"sql(
ALTER TABLE last_batches ADD COLUMN mid_step_before INTEGER NOT NULL DEFAULT 0;
)sql",
    // 4: the checkpoint the ranks' state is (v1::Job::state_checkpoint), so
    // that a restarted coordinator still knows the state is saved ('' for
    // rows written before: not known, a restart then saves once more).
    R"sql(
ALTER TABLE jobs ADD COLUMN state_checkpoint TEXT NOT NULL DEFAULT '';
)sql",
    // 5: the ranks' checkpoint history (CheckpointHistory; none for rows
    // written before: every checkpoint is of it, as recoveries chose before).
    R"sql(
ALTER TABLE jobs ADD COLUMN history_loaded TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN history_loaded_step INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN history_loaded_created_micros INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN history_since_micros INTEGER NOT NULL DEFAULT 0;
)sql",
    // 6: a step batch journaled while the batch before it ran
    // (TrainingJob::JournalAhead), and whether that one was sent mid-step, so
    // a restart that finds the ranks two seqs short of it knows where they
    // are (none for rows written before: each was written before its send).
    R"sql(
ALTER TABLE last_batches ADD COLUMN written_ahead INTEGER NOT NULL DEFAULT 0;
ALTER TABLE last_batches ADD COLUMN previous_mid_step_before INTEGER NOT NULL DEFAULT 0;
)sql",
};
constexpr int kNumMigrations = static_cast<int>(std::size(kMigrations));
static_assert(kNumMigrations == StateStore::kSchemaVersion);

}  // namespace

int StateStore::schema_version() const {
  std::lock_guard<std::mutex> lock(mu_);
  SqliteStatement s = StatementLocked("PRAGMA user_version");
  return s.Next() ? static_cast<int>(s.ColumnInt(0)) : -1;
}

absl::Status StateStore::Migrate() {
  const int version = schema_version();
  if (version > kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--state-dir ", dir_, " was written by a newer flatshard (schema version ", version,
        "; this build reads up to ", kSchemaVersion,
        "): run the newer flatshard-coordinator, or give this one another --state-dir"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (int v = version; v < kSchemaVersion; ++v) {
    // One transaction per step: a crash mid-migration leaves the old version.
    RETURN_IF_ERROR(ExecLocked(absl::StrCat("BEGIN IMMEDIATE; ", kMigrations[v],
                                            "PRAGMA user_version = ", v + 1, "; COMMIT;")));
  }
  return absl::OkStatus();
}

}  // namespace flatshard
