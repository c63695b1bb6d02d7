// StateStore on a real SQLite file: what is put comes back after the store is
// closed and opened again, a second opener is kept off the directory, and a
// database from a newer schema is refused rather than misread.
#include "coordinator/state_store.h"

#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>

namespace flatshard {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string FreshDir(const std::string& tag) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("state-store-" + tag);
  fs::remove_all(dir);
  return dir.string();
}

JobRecord SomeJob() {
  JobRecord job;
  job.spec.set_name("gpt");
  job.spec.set_world_size(4);
  job.state = v1::TRAINING;
  job.epoch = 3;
  job.step = 41;
  job.data_position = 82;
  job.last_seq = 97;
  job.restarts = 2;
  job.world_size = 3;
  job.worker_ids = {"w-b", "w-a", "w-c"};
  v1::Recovery recovery;
  recovery.set_cause("rank 1 died");
  recovery.set_steps_lost(5);
  job.last_recovery = recovery;
  job.state_checkpoint = "step-00000040";
  job.history = CheckpointHistory{"step-00000030", 30, 1700000000000001, 1700000000123456};
  return job;
}

// Takes the state dir's database back to an earlier schema, as an earlier
// flatshard left it: `sql` drops what came after, then the version is set.
void RewindSchema(const std::string& dir, const std::string& sql, int version) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir + "/coordinator.db").c_str(), &db), SQLITE_OK);
  const std::string all = sql + " PRAGMA user_version = " + std::to_string(version);
  EXPECT_EQ(sqlite3_exec(db, all.c_str(), nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
}

// Migrations 5 and 6 add these columns.
constexpr char kDropSince5[] =
    "ALTER TABLE jobs DROP COLUMN history_loaded; "
    "ALTER TABLE jobs DROP COLUMN history_loaded_step; "
    "ALTER TABLE jobs DROP COLUMN history_loaded_created_micros; "
    "ALTER TABLE jobs DROP COLUMN history_since_micros; "
    "ALTER TABLE last_batches DROP COLUMN written_ahead; "
    "ALTER TABLE last_batches DROP COLUMN previous_mid_step_before;";

TEST(StateStoreTest, WhatIsPutSurvivesReopening) {
  const std::string dir = FreshDir("reopen");
  {
    auto store = StateStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_EQ((*store)->schema_version(), StateStore::kSchemaVersion);
    ASSERT_TRUE((*store)->PutJob(SomeJob()).ok());
    ASSERT_TRUE((*store)->PutProgress("gpt", 42, 84, 99).ok());
    BatchRecord batch;
    batch.batch.set_job_epoch(3);
    batch.batch.set_seq(100);
    batch.batch.mutable_step()->set_step(84);
    batch.step_after = 43;
    batch.data_position_after = 85;
    batch.mid_step_before = true;
    batch.written_ahead = true;
    batch.previous_mid_step_before = true;
    ASSERT_TRUE((*store)->PutLastBatch("gpt", batch).ok());
    v1::TrainingOperation op;
    op.set_target_step(100);
    op.set_no_sync_micro_steps(1);
    op.set_started_by("alice");
    op.set_started_at_unix(1700000000.5);
    ASSERT_TRUE((*store)->PutOperation("gpt", op).ok());
    WorkerRecord worker;
    worker.worker_id = "w-a";
    worker.host = "h1";
    worker.device = "cpu";
    worker.address = "10.0.0.1:5000";
    worker.rank = 1;
    ASSERT_TRUE((*store)->PutWorker(worker).ok());
    v1::CheckpointInfo c;
    c.set_name("step-00000040");
    c.set_step(40);
    c.set_state_dict_type(v1::SHARDED_STATE_DICT);
    c.set_world_size(3);
    c.set_latest(true);
    ASSERT_TRUE((*store)->PutCheckpoints("gpt", {c}).ok());
  }
  auto store = StateStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  auto jobs = (*store)->LoadJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 1u);
  const JobRecord& job = (*jobs)[0];
  EXPECT_EQ(job.spec.name(), "gpt");
  EXPECT_EQ(job.spec.world_size(), 4);
  EXPECT_EQ(job.state, v1::TRAINING);
  EXPECT_EQ(job.epoch, 3u);
  EXPECT_EQ(job.step, 42);  // the progress update
  EXPECT_EQ(job.data_position, 84);
  EXPECT_EQ(job.last_seq, 99u);
  EXPECT_EQ(job.restarts, 2);
  EXPECT_EQ(job.world_size, 3);
  EXPECT_THAT(job.worker_ids, ElementsAre("w-b", "w-a", "w-c"));
  ASSERT_TRUE(job.last_recovery.has_value());
  EXPECT_EQ(job.last_recovery->steps_lost(), 5);
  EXPECT_EQ(job.state_checkpoint, "step-00000040");
  EXPECT_EQ(job.history.loaded, "step-00000030");
  EXPECT_EQ(job.history.loaded_step, 30);
  EXPECT_EQ(job.history.loaded_created_unix_micros, 1700000000000001);
  EXPECT_EQ(job.history.since_unix_micros, 1700000000123456);
  auto batch = (*store)->LoadLastBatch("gpt");
  ASSERT_TRUE(batch.ok() && batch->has_value());
  EXPECT_EQ((*batch)->batch.seq(), 100u);
  EXPECT_EQ((*batch)->batch.step().step(), 84);
  EXPECT_EQ((*batch)->step_after, 43);
  EXPECT_TRUE((*batch)->mid_step_before);
  EXPECT_TRUE((*batch)->written_ahead);
  EXPECT_TRUE((*batch)->previous_mid_step_before);
  auto op = (*store)->LoadOperation("gpt");
  ASSERT_TRUE(op.ok() && op->has_value());
  EXPECT_EQ((*op)->target_step(), 100);
  EXPECT_EQ((*op)->no_sync_micro_steps(), 1);
  EXPECT_EQ((*op)->started_by(), "alice");
  EXPECT_EQ((*op)->started_at_unix(), 1700000000.5);
  auto workers = (*store)->LoadWorkers();
  ASSERT_TRUE(workers.ok());
  ASSERT_EQ(workers->size(), 1u);
  EXPECT_EQ((*workers)[0].address, "10.0.0.1:5000");
  EXPECT_EQ((*workers)[0].rank, 1);
  auto checkpoints = (*store)->LoadCheckpoints("gpt");
  ASSERT_TRUE(checkpoints.ok());
  ASSERT_EQ(checkpoints->size(), 1u);
  EXPECT_EQ((*checkpoints)[0].state_dict_type(), v1::SHARDED_STATE_DICT);
  EXPECT_TRUE((*checkpoints)[0].latest());

  // The operation ends; the job is deleted with everything it owns.
  ASSERT_TRUE((*store)->PutOperation("gpt", std::nullopt).ok());
  EXPECT_FALSE((*store)->LoadOperation("gpt")->has_value());
  ASSERT_TRUE((*store)->DeleteJob("gpt").ok());
  EXPECT_TRUE((*store)->LoadJobs()->empty());
  EXPECT_FALSE((*store)->LoadLastBatch("gpt")->has_value());
  EXPECT_TRUE((*store)->LoadCheckpoints("gpt")->empty());
}

TEST(StateStoreTest, ASecondCoordinatorIsKeptOff) {
  const std::string dir = FreshDir("lock");
  auto first = StateStore::Open(dir);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = StateStore::Open(dir);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr("in use by another flatshard-coordinator"));
  first->reset();
  EXPECT_TRUE(StateStore::Open(dir).ok());  // released with the first
}

TEST(StateStoreTest, ANewerSchemaIsRefused) {
  const std::string dir = FreshDir("newer");
  ASSERT_TRUE(StateStore::Open(dir).ok());
  ASSERT_NO_FATAL_FAILURE(RewindSchema(dir, "", 99));  // "rewound" forward
  auto store = StateStore::Open(dir);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(store.status().message(), HasSubstr("newer flatshard (schema version 99"));
  EXPECT_THAT(store.status().message(), HasSubstr(dir));
}

// The state checkpoint is named by a save's commit and cleared by the batch
// that changes the state, in that batch's transaction; a batch that does not
// change it leaves it.
TEST(StateStoreTest, TheStateCheckpointIsNamedAndClearedWithItsBatch) {
  const std::string dir = FreshDir("state-checkpoint");
  auto store = StateStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  JobRecord job = SomeJob();
  job.state_checkpoint.clear();
  ASSERT_TRUE((*store)->PutJob(job).ok());
  const auto stored = [&]() -> std::string {
    auto jobs = (*store)->LoadJobs();
    return jobs.ok() && jobs->size() == 1 ? (*jobs)[0].state_checkpoint : "(unreadable)";
  };
  EXPECT_EQ(stored(), "");
  ASSERT_TRUE((*store)->PutStateCheckpoint("gpt", "stop-1").ok());
  EXPECT_EQ(stored(), "stop-1");
  BatchRecord batch;
  batch.batch.set_job_epoch(3);
  batch.batch.set_seq(7);
  ASSERT_TRUE((*store)->PutLastBatch("gpt", batch, /*clears_state_checkpoint=*/false).ok());
  EXPECT_EQ(stored(), "stop-1");
  batch.batch.set_seq(8);
  ASSERT_TRUE((*store)->PutLastBatch("gpt", batch, /*clears_state_checkpoint=*/true).ok());
  EXPECT_EQ(stored(), "");
  EXPECT_EQ((*(*store)->LoadLastBatch("gpt"))->batch.seq(), 8u);
  // The whole record's write carries it too.
  job.state_checkpoint = "step-00000050";
  ASSERT_TRUE((*store)->PutJob(job).ok());
  EXPECT_EQ(stored(), "step-00000050");
}

// The store keeps its statements prepared between calls (the journal runs on
// every step): none of them may keep a read open once its call returned, or an
// operator's backup or checkpoint of the database would wait on the coordinator.
TEST(StateStoreTest, AReadLeavesNothingOpenForOtherConnections) {
  const std::string dir = FreshDir("no-open-read");
  auto store = StateStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->PutJob(SomeJob()).ok());
  BatchRecord batch;
  batch.batch.set_job_epoch(3);
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    batch.batch.set_seq(seq);
    ASSERT_TRUE((*store)->PutLastBatch("gpt", batch).ok());
  }
  // Each of these stops at its first row, or reads all of them.
  ASSERT_TRUE((*store)->LoadLastBatch("gpt").ok());
  ASSERT_TRUE((*store)->LoadJobs().ok());
  ASSERT_TRUE((*store)->LoadOperation("gpt").ok());

  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open((dir + "/coordinator.db").c_str(), &other), SQLITE_OK);
  sqlite3_stmt* checkpoint = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(other, "PRAGMA wal_checkpoint(TRUNCATE)", -1, &checkpoint, nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(checkpoint), SQLITE_ROW);
  // busy 0: no reader held it back; the log was copied and truncated.
  EXPECT_EQ(sqlite3_column_int(checkpoint, 0), 0);
  EXPECT_EQ(sqlite3_column_int(checkpoint, 1), 0);
  sqlite3_finalize(checkpoint);
  sqlite3_close(other);

  // And the statements still run on the checkpointed database; one row a job.
  batch.batch.set_seq(4);
  ASSERT_TRUE((*store)->PutLastBatch("gpt", batch).ok());
  auto last = (*store)->LoadLastBatch("gpt");
  ASSERT_TRUE(last.ok() && last->has_value()) << last.status();
  EXPECT_EQ((*last)->batch.seq(), 4u);
}

// A state dir an earlier flatshard wrote (schema 2: no mid_step_before, no
// state_checkpoint) is migrated in place; its journaled batch reads as sent
// at a step boundary, its state as no known checkpoint.
TEST(StateStoreTest, AnOlderSchemaIsMigrated) {
  const std::string dir = FreshDir("older");
  {
    auto store = StateStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->PutJob(SomeJob()).ok());
    BatchRecord batch;
    batch.batch.set_job_epoch(1);
    batch.batch.set_seq(5);
    batch.mid_step_before = true;
    batch.written_ahead = true;
    ASSERT_TRUE((*store)->PutLastBatch("gpt", batch).ok());
  }
  ASSERT_NO_FATAL_FAILURE(RewindSchema(dir,
                                       std::string("ALTER TABLE last_batches DROP COLUMN "
                                                   "mid_step_before; ALTER TABLE jobs DROP COLUMN "
                                                   "state_checkpoint; ") +
                                           kDropSince5,
                                       2));
  auto store = StateStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->schema_version(), StateStore::kSchemaVersion);
  auto batch = (*store)->LoadLastBatch("gpt");
  ASSERT_TRUE(batch.ok() && batch->has_value());
  EXPECT_EQ((*batch)->batch.seq(), 5u);
  EXPECT_FALSE((*batch)->mid_step_before);
  EXPECT_FALSE((*batch)->written_ahead);  // written before its send, as every row then
  auto jobs = (*store)->LoadJobs();
  ASSERT_TRUE(jobs.ok() && jobs->size() == 1) << jobs.status();
  EXPECT_EQ((*jobs)[0].state_checkpoint, "");
  EXPECT_EQ((*jobs)[0].history.loaded, "");  // every checkpoint is of its history
  EXPECT_EQ((*jobs)[0].history.since_unix_micros, 0);
}

// Schema 4 (the state checkpoint, no history) is migrated too: the job keeps
// its state checkpoint, and has no history yet.
TEST(StateStoreTest, ASchema4DirKeepsItsStateCheckpoint) {
  const std::string dir = FreshDir("schema-4");
  {
    auto store = StateStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->PutJob(SomeJob()).ok());
  }
  ASSERT_NO_FATAL_FAILURE(RewindSchema(dir, kDropSince5, 4));
  auto store = StateStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->schema_version(), StateStore::kSchemaVersion);
  auto jobs = (*store)->LoadJobs();
  ASSERT_TRUE(jobs.ok() && jobs->size() == 1) << jobs.status();
  EXPECT_EQ((*jobs)[0].state_checkpoint, "step-00000040");
  EXPECT_EQ((*jobs)[0].history.loaded, "");
  EXPECT_EQ((*jobs)[0].history.loaded_step, 0);
  EXPECT_EQ((*jobs)[0].history.loaded_created_unix_micros, 0);
  EXPECT_EQ((*jobs)[0].history.since_unix_micros, 0);
}

TEST(StateStoreTest, AnUnusableDirectoryIsNamed) {
  const std::string file = FreshDir("file");
  { std::ofstream(file) << "not a directory"; }
  auto store = StateStore::Open(file + "/sub");
  ASSERT_FALSE(store.ok());
  EXPECT_THAT(store.status().message(), HasSubstr("--state-dir " + file + "/sub"));
}

}  // namespace
}  // namespace flatshard
