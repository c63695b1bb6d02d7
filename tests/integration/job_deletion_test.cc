// Deleting a job when its record cannot be removed from the state store, with
// a real coordinator and workers and the coordinator's real SQLite database
// (docs/fault-tolerance.md, "Deleting a job"). Another process holding the
// database makes the removal fail: the delete is refused (UNAVAILABLE) and the
// job stays STOPPED rather than reported gone while a restarted coordinator
// would bring it back; a retry, or the next CreateJob, finishes it. A deletion
// cut short by a crash after the job was stopped is finished by the next start.
#include <chrono>
#include <csignal>
#include <future>
#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

#include "client/flatshard_client.h"
#include "client/local_cluster.h"
#include "storage/spec_files.h"
#include "tests/integration/multiprocess.h"
#include "tests/integration/recovery_harness.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;

// A connection of the test's own to the coordinator's database, as an
// operator's sqlite3 shell or a backup tool would open one.
class StateDb {
 public:
  explicit StateDb(const std::string& state_dir) {
    const std::string path = state_dir + "/coordinator.db";
    EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK)
        << path;
    sqlite3_busy_timeout(db_, 30000);  // the coordinator may be writing
  }
  ~StateDb() { sqlite3_close(db_); }
  StateDb(const StateDb&) = delete;
  StateDb& operator=(const StateDb&) = delete;

  void Exec(const std::string& sql) {
    char* message = nullptr;
    EXPECT_EQ(sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &message), SQLITE_OK)
        << sql << ": " << (message == nullptr ? "" : message);
    sqlite3_free(message);
  }
  // The job records the store holds.
  int Jobs() { return Rows("jobs"); }
  // The rows of `table`.
  int Rows(const std::string& table) {
    sqlite3_stmt* s = nullptr;
    const std::string sql = "SELECT count(*) FROM " + table;
    EXPECT_EQ(sqlite3_prepare_v2(db_, sql.c_str(), -1, &s, nullptr), SQLITE_OK) << sql;
    const int n = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int(s, 0) : -1;
    sqlite3_finalize(s);
    return n;
  }

 private:
  sqlite3* db_ = nullptr;
};

v1::JobSpec Job(const std::string& name) {
  auto spec = LoadJobSpecFile(std::string(FLATSHARD_SOURCE_DIR) + "/examples/mlp-job.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  spec->set_name(name);
  spec->set_world_size(2);
  return *spec;
}

// A coordinator with a state dir and two workers, and a client that outlives
// the coordinator's restarts.
class JobDeletionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("job-deletion");
    LocalClusterOptions options;
    options.workers = 2;
    options.bin_dir = FLATSHARD_BIN_DIR;
    options.heartbeat_interval_s = 0.25;
    options.heartbeat_timeout_s = 2.0;
    options.checkpoint_dir = dir_ + "/checkpoints";
    options.state_dir = state_dir();
    auto started = LocalCluster::Start(options);
    ASSERT_TRUE(started.ok()) << started.status();
    cluster_ = *std::move(started);
    client_ = std::make_unique<FlatshardClient>(cluster_->address());
  }
  std::string state_dir() const { return dir_ + "/state"; }

  // Creates `job` and deletes it while another connection holds the
  // database's write lock: refused, the job left STOPPED, its record there.
  void ExpectDeleteRefusedWhileTheStoreIsLocked(const std::string& job) {
    testing::CreateAndWaitReady(*client_, Job(job));
    StateDb db(state_dir());
    db.Exec("BEGIN EXCLUSIVE");
    const absl::Status deleted = client_->DeleteJob(job);
    EXPECT_EQ(deleted.code(), absl::StatusCode::kUnavailable) << deleted;
    EXPECT_THAT(std::string(deleted.message()), HasSubstr("is stopped but not deleted"));
    EXPECT_THAT(std::string(deleted.message()), HasSubstr("database is locked"));
    EXPECT_THAT(std::string(deleted.message()), HasSubstr("retry `flatshard job delete " + job));
    db.Exec("ROLLBACK");
    auto after = client_->GetJob(job);
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_EQ(after->state(), v1::STOPPED);
    EXPECT_EQ(db.Jobs(), 1);
  }

  // After a restart: the client's read is retried past the dead connection
  // (rpc/read_retries.h) rather than failing UNAVAILABLE.
  void ExpectGone(const std::string& job) {
    const auto gone = client_->GetJob(job);
    EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound) << gone.status();
  }

  std::string dir_;
  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<FlatshardClient> client_;
};

TEST_F(JobDeletionTest, ADeleteTheStoreCannotRecordIsRefusedAndARetryFinishesIt) {
  ExpectDeleteRefusedWhileTheStoreIsLocked("mlp-demo");
  ASSERT_TRUE(client_->DeleteJob("mlp-demo").ok());
  ExpectGone("mlp-demo");
  EXPECT_EQ(StateDb(state_dir()).Jobs(), 0);
  // Gone for good: a restarted coordinator does not bring it back.
  ASSERT_TRUE(cluster_->KillAndRestartCoordinator().ok());
  ExpectGone("mlp-demo");
}

TEST_F(JobDeletionTest, TheNextJobFinishesADeleteTheStoreCouldNotRecord) {
  ExpectDeleteRefusedWhileTheStoreIsLocked("mlp-a");
  // The restored job would be the first by name: mlp-a, not the new one.
  testing::CreateAndWaitReady(*client_, Job("mlp-b"));
  EXPECT_EQ(StateDb(state_dir()).Jobs(), 1);
  ASSERT_TRUE(cluster_->KillAndRestartCoordinator().ok());
  ExpectGone("mlp-a");
  auto ready = client_->WaitForState("mlp-b", {v1::READY}, absl::Seconds(120));
  EXPECT_TRUE(ready.ok()) << ready.status();
}

// Finishing that deletion waits on the store as long as another connection
// holds its lock (up to the store's 5 s busy timeout): the coordinator
// answers meanwhile, turning other deletes away as busy rather than holding
// them, and every heartbeat, on its lock.
TEST_F(JobDeletionTest, TheNextJobFinishesTheDeleteWithoutHoldingTheCoordinator) {
  ExpectDeleteRefusedWhileTheStoreIsLocked("mlp-a");
  StateDb db(state_dir());
  db.Exec("BEGIN EXCLUSIVE");
  FlatshardClient creator(cluster_->address());
  auto created =
      std::async(std::launch::async, [&creator] { return creator.CreateJob(Job("mlp-b")); });
  const auto waiting = [&created] {
    return created.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
  };
  bool busy = false;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (!busy && waiting() && absl::Now() < deadline) {
    const absl::Status probe = client_->DeleteJob("no-such-job");
    busy = absl::StrContains(probe.message(), "job 'mlp-b' is being created");
    if (!busy) {
      EXPECT_EQ(probe.code(), absl::StatusCode::kNotFound) << probe;
    }
  }
  EXPECT_TRUE(busy) << "no delete was answered while the creation waited on the store";
  auto a = client_->GetJob("mlp-a");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->state(), v1::STOPPED);
  EXPECT_TRUE(waiting()) << "the creation did not wait on the store";
  // The store never took the removal: the job is not created.
  const absl::Status not_created = created.get().status();
  EXPECT_EQ(not_created.code(), absl::StatusCode::kUnavailable) << not_created;
  EXPECT_THAT(std::string(not_created.message()),
              HasSubstr("job 'mlp-b' was not created: job 'mlp-a' was deleted but kept its "
                        "record: "));
  db.Exec("ROLLBACK");
  EXPECT_EQ(db.Jobs(), 1);
  testing::CreateAndWaitReady(*client_, Job("mlp-b"));
  EXPECT_EQ(db.Jobs(), 1);
  ExpectGone("mlp-a");
}

TEST_F(JobDeletionTest, ADeletionCutShortByACrashIsFinishedByTheNextStart) {
  testing::CreateAndWaitReady(*client_, Job("mlp-demo"));
  // Killed after the job was stopped (STOPPED persisted), before its record
  // was removed.
  ASSERT_TRUE(cluster_
                  ->KillAndRestartCoordinator(
                      [&] { StateDb(state_dir()).Exec("UPDATE jobs SET state='STOPPED'"); })
                  .ok());
  ExpectGone("mlp-demo");
  EXPECT_EQ(StateDb(state_dir()).Jobs(), 0);
  // The coordinator takes a new job.
  testing::CreateAndWaitReady(*client_, Job("mlp-next"));
}

// A deletion the next start cannot finish either (the store refuses the
// removal) leaves the record, STOPPED and not restored; the next create
// removes it first, as it does a refused delete's. The record is written
// over, not replaced, so a job of the same name would otherwise take on the
// old one's training operation, and a restart would resume it.
TEST_F(JobDeletionTest, ADeletionTheStartCannotFinishIsFinishedByTheNextJob) {
  testing::CreateAndWaitReady(*client_, Job("mlp-demo"));
  // A training operation cut short by a crash keeps its row for the restart.
  bool killed = false;
  const absl::Status cut = client_->Train("mlp-demo", 100000, 0, [&](const v1::StepResult& r) {
    if (r.step() >= 2 && !killed) {
      killed = true;
      cluster_->coordinator().Signal(SIGKILL);
    }
  });
  EXPECT_EQ(cut.code(), absl::StatusCode::kUnavailable) << cut;
  StateDb db(state_dir());
  ASSERT_TRUE(cluster_
                  ->KillAndRestartCoordinator([&] {
                    db.Exec("UPDATE jobs SET state='STOPPED'");  // a deletion cut short
                    db.Exec("BEGIN EXCLUSIVE");                  // and its finish refused
                  })
                  .ok());
  db.Exec("ROLLBACK");
  ExpectGone("mlp-demo");
  EXPECT_EQ(db.Jobs(), 1);
  EXPECT_EQ(db.Rows("operations"), 1);
  testing::CreateAndWaitReady(*client_, Job("mlp-demo"));
  EXPECT_EQ(db.Jobs(), 1);
  EXPECT_EQ(db.Rows("operations"), 0) << "the new job took on the old one's training";
  // Restarted, the new job is back as created: READY, not training.
  ASSERT_TRUE(cluster_->KillAndRestartCoordinator().ok());
  auto ready = client_->WaitForState("mlp-demo", {v1::READY}, absl::Seconds(120));
  ASSERT_TRUE(ready.ok()) << ready.status();
  auto job = client_->GetJob("mlp-demo");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::READY);
  EXPECT_EQ(job->step(), 0);
}

}  // namespace
}  // namespace flatshard
