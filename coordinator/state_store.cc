#include "coordinator/state_store.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

#include "coordinator/sqlite_statement.h"
#include "core/status_macros.h"

namespace flatshard {
namespace {

absl::Status ParseProto(const std::string& bytes, google::protobuf::Message* out,
                        const std::string& what) {
  if (!out->ParseFromString(bytes)) {
    return absl::DataLossError(absl::StrCat("state store: ", what, " does not parse"));
  }
  return absl::OkStatus();
}

double Seconds(absl::Time t) { return absl::ToDoubleSeconds(t - absl::UnixEpoch()); }

constexpr int kMinSqliteVersion = 3024000;  // INSERT ... ON CONFLICT DO UPDATE

}  // namespace

absl::StatusOr<std::unique_ptr<StateStore>> StateStore::Open(const std::string& dir) {
  // The build asks for 3.24 (CMake), but the library loaded at run time may
  // be older: its journal upsert would then fail on every step.
  if (sqlite3_libversion_number() < kMinSqliteVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("--state-dir ", dir, ": SQLite ", sqlite3_libversion(),
                     " is too old; the state store needs 3.24 or later (upserts)"));
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("--state-dir ", dir, ": cannot create it: ", ec.message()));
  }
  const std::string lock_path = dir + "/LOCK";
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--state-dir ", dir, ": cannot open ", lock_path, ": ", strerror(errno)));
  }
  // flock is released when the process dies, kill -9 included.
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("--state-dir ", dir, " is in use by another flatshard-coordinator (it holds ",
                     lock_path, "); stop it or give this one another --state-dir"));
  }
  const std::string path = dir + "/coordinator.db";
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    const std::string message = db == nullptr ? "out of memory" : sqlite3_errmsg(db);
    sqlite3_close(db);
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("--state-dir ", dir, ": cannot open ", path, ": ", message));
  }
  sqlite3_busy_timeout(db, 5000);
  std::unique_ptr<StateStore> store(new StateStore(dir, db, fd));
  {
    std::lock_guard<std::mutex> lock(store->mu_);
    RETURN_IF_ERROR(store->ExecLocked("PRAGMA journal_mode=WAL; PRAGMA foreign_keys=ON;"));
    RETURN_IF_ERROR(store->SynchronousLocked(Synchronous::kFull));
  }
  RETURN_IF_ERROR(store->Migrate());
  return store;
}

StateStore::StateStore(std::string dir, sqlite3* db, int lock_fd)
    : dir_(std::move(dir)),
      db_(db),
      statements_(std::make_unique<SqliteStatementCache>(db)),
      lock_fd_(lock_fd) {}

StateStore::~StateStore() {
  statements_.reset();  // a connection with prepared statements left does not close
  sqlite3_close(db_);
  ::close(lock_fd_);
}

absl::Status StateStore::ExecLocked(const std::string& sql) {
  char* message = nullptr;
  if (const int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &message); rc != SQLITE_OK) {
    absl::Status status = SqliteStatus(rc, absl::StrCat("state store ", dir_), message);
    sqlite3_free(message);
    return status;
  }
  return absl::OkStatus();
}

SqliteStatement StateStore::StatementLocked(const char* sql) const { return statements_->Get(sql); }

absl::Status StateStore::SynchronousLocked(Synchronous mode) {
  if (mode == synchronous_) return absl::OkStatus();
  synchronous_ = Synchronous::kUnknown;  // until the PRAGMA succeeded
  RETURN_IF_ERROR(ExecLocked(mode == Synchronous::kFull ? "PRAGMA synchronous=FULL"
                                                        : "PRAGMA synchronous=NORMAL"));
  synchronous_ = mode;
  return absl::OkStatus();
}

absl::Status StateStore::EndTransactionLocked(const absl::Status& body) {
  if (body.ok()) {
    absl::Status committed = ExecLocked("COMMIT");
    if (committed.ok()) return committed;
    // A COMMIT that failed (SQLITE_BUSY, a full disk) may leave the
    // transaction open, and every later BEGIN would fail with it.
    if (sqlite3_get_autocommit(db_) == 0) (void)ExecLocked("ROLLBACK");
    return committed;
  }
  (void)ExecLocked("ROLLBACK");
  return body;
}

absl::Status StateStore::PutJob(const JobRecord& job) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string& name = job.spec.name();
  RETURN_IF_ERROR(SynchronousLocked(Synchronous::kFull));
  RETURN_IF_ERROR(ExecLocked("BEGIN IMMEDIATE"));
  absl::Status status = [&]() -> absl::Status {
    SqliteStatement put = StatementLocked(
        "INSERT INTO jobs(name, spec, state, failure, epoch, step, data_position, "
        "last_seq, restarts, world_size, last_recovery, updated_at, state_checkpoint, "
        "history_loaded, history_loaded_created_micros, history_since_micros, "
        "history_loaded_step) VALUES "
        "(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17) ON CONFLICT(name) DO "
        "UPDATE SET spec=?2, state=?3, failure=?4, epoch=?5, step=?6, data_position=?7, "
        "last_seq=?8, restarts=?9, world_size=?10, last_recovery=?11, updated_at=?12, "
        "state_checkpoint=?13, history_loaded=?14, history_loaded_created_micros=?15, "
        "history_since_micros=?16, history_loaded_step=?17");
    put.Text(1, name)
        .Blob(2, job.spec.SerializeAsString())
        .Text(3, v1::JobState_Name(job.state))
        .Text(4, job.failure)
        .Int(5, static_cast<int64_t>(job.epoch))
        .Int(6, job.step)
        .Int(7, job.data_position)
        .Int(8, static_cast<int64_t>(job.last_seq))
        .Int(9, job.restarts)
        .Int(10, job.world_size)
        .Real(12, Seconds(absl::Now()))
        .Text(13, job.state_checkpoint)
        .Text(14, job.history.loaded)
        .Int(15, job.history.loaded_created_unix_micros)
        .Int(16, job.history.since_unix_micros)
        .Int(17, job.history.loaded_step);
    if (job.last_recovery.has_value()) {
      put.Blob(11, job.last_recovery->SerializeAsString());
    } else {
      put.Null(11);
    }
    RETURN_IF_ERROR(put.Run());
    RETURN_IF_ERROR(StatementLocked("DELETE FROM job_members WHERE job=?1").Text(1, name).Run());
    for (size_t r = 0; r < job.worker_ids.size(); ++r) {
      RETURN_IF_ERROR(
          StatementLocked("INSERT INTO job_members(job, rank, worker_id) VALUES (?1,?2,?3)")
              .Text(1, name)
              .Int(2, static_cast<int64_t>(r))
              .Text(3, job.worker_ids[r])
              .Run());
    }
    return absl::OkStatus();
  }();
  return EndTransactionLocked(status);
}

absl::Status StateStore::PutProgress(const std::string& job, int64_t step, int64_t data_position,
                                     uint64_t last_seq) {
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(SynchronousLocked(Synchronous::kNormal));
  return StatementLocked(
             "UPDATE jobs SET step=?2, data_position=?3, last_seq=?4, updated_at=?5 "
             "WHERE name=?1")
      .Text(1, job)
      .Int(2, step)
      .Int(3, data_position)
      .Int(4, static_cast<int64_t>(last_seq))
      .Real(5, Seconds(absl::Now()))
      .Run();
}

absl::Status StateStore::DeleteJob(const std::string& job) {
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(SynchronousLocked(Synchronous::kFull));
  return StatementLocked("DELETE FROM jobs WHERE name=?1").Text(1, job).Run();
}

absl::StatusOr<std::vector<JobRecord>> StateStore::LoadJobs() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<JobRecord> jobs;
  SqliteStatement s = StatementLocked(
      "SELECT name, spec, state, failure, epoch, step, data_position, last_seq, "
      "restarts, world_size, last_recovery, state_checkpoint, history_loaded, "
      "history_loaded_created_micros, history_since_micros, history_loaded_step FROM jobs "
      "ORDER BY name");
  while (s.Next()) {
    JobRecord job;
    const std::string name = s.ColumnString(0);
    RETURN_IF_ERROR(ParseProto(s.ColumnString(1), &job.spec, absl::StrCat("job ", name, " spec")));
    if (!v1::JobState_Parse(s.ColumnString(2), &job.state)) {
      return absl::DataLossError(
          absl::StrCat("state store: job ", name, " has unknown state '", s.ColumnString(2), "'"));
    }
    job.failure = s.ColumnString(3);
    job.epoch = static_cast<uint64_t>(s.ColumnInt(4));
    job.step = s.ColumnInt(5);
    job.data_position = s.ColumnInt(6);
    job.last_seq = static_cast<uint64_t>(s.ColumnInt(7));
    job.restarts = static_cast<int>(s.ColumnInt(8));
    job.world_size = static_cast<int>(s.ColumnInt(9));
    if (!s.ColumnNull(10)) {
      v1::Recovery recovery;
      RETURN_IF_ERROR(
          ParseProto(s.ColumnString(10), &recovery, absl::StrCat("job ", name, " last recovery")));
      job.last_recovery = recovery;
    }
    job.state_checkpoint = s.ColumnString(11);
    job.history.loaded = s.ColumnString(12);
    job.history.loaded_created_unix_micros = s.ColumnInt(13);
    job.history.since_unix_micros = s.ColumnInt(14);
    job.history.loaded_step = s.ColumnInt(15);
    jobs.push_back(std::move(job));
  }
  RETURN_IF_ERROR(s.status());
  for (JobRecord& job : jobs) {
    SqliteStatement m =
        StatementLocked("SELECT worker_id FROM job_members WHERE job=?1 ORDER BY rank");
    m.Text(1, job.spec.name());
    while (m.Next()) job.worker_ids.push_back(m.ColumnString(0));
    RETURN_IF_ERROR(m.status());
  }
  return jobs;
}

absl::Status StateStore::PutLastBatch(const std::string& job, const BatchRecord& batch,
                                      bool clears_state_checkpoint) {
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(SynchronousLocked(Synchronous::kNormal));
  if (clears_state_checkpoint) RETURN_IF_ERROR(ExecLocked("BEGIN IMMEDIATE"));
  // An upsert, not INSERT OR REPLACE: the row is updated in place, one page
  // in the commit (while the batch fits in one), where a replace deletes and
  // reinserts it and its key.
  absl::Status status =
      StatementLocked(
          "INSERT INTO last_batches(job, epoch, seq, batch, step_after, data_position_after, "
          "mid_step_before, written_ahead, previous_mid_step_before) VALUES "
          "(?1,?2,?3,?4,?5,?6,?7,?8,?9) ON CONFLICT(job) DO UPDATE SET epoch=?2, seq=?3, "
          "batch=?4, step_after=?5, data_position_after=?6, mid_step_before=?7, "
          "written_ahead=?8, previous_mid_step_before=?9")
          .Text(1, job)
          .Int(2, static_cast<int64_t>(batch.batch.job_epoch()))
          .Int(3, static_cast<int64_t>(batch.batch.seq()))
          .Blob(4, batch.batch.SerializeAsString())
          .Int(5, batch.step_after)
          .Int(6, batch.data_position_after)
          .Int(7, batch.mid_step_before ? 1 : 0)
          .Int(8, batch.written_ahead ? 1 : 0)
          .Int(9, batch.previous_mid_step_before ? 1 : 0)
          .Run();
  if (clears_state_checkpoint) {
    // In the batch's transaction: no restart finds the batch journaled (and
    // so perhaps run) with the state still named as a checkpoint.
    if (status.ok()) {
      status =
          StatementLocked("UPDATE jobs SET state_checkpoint='' WHERE name=?1").Text(1, job).Run();
    }
    status = EndTransactionLocked(status);
  }
  return status;
}

absl::Status StateStore::PutStateCheckpoint(const std::string& job, const std::string& checkpoint) {
  std::lock_guard<std::mutex> lock(mu_);
  // Not fsynced: lost on power loss, a restart does not know the state and
  // saves once more (never the other way: a clear is in its batch's commit).
  RETURN_IF_ERROR(SynchronousLocked(Synchronous::kNormal));
  return StatementLocked("UPDATE jobs SET state_checkpoint=?2 WHERE name=?1")
      .Text(1, job)
      .Text(2, checkpoint)
      .Run();
}

absl::StatusOr<std::optional<BatchRecord>> StateStore::LoadLastBatch(const std::string& job) const {
  std::lock_guard<std::mutex> lock(mu_);
  SqliteStatement s = StatementLocked(
      "SELECT batch, step_after, data_position_after, mid_step_before, written_ahead, "
      "previous_mid_step_before FROM last_batches WHERE job=?1");
  s.Text(1, job);
  if (!s.Next()) {
    RETURN_IF_ERROR(s.status());
    return std::nullopt;
  }
  BatchRecord record;
  RETURN_IF_ERROR(
      ParseProto(s.ColumnString(0), &record.batch, absl::StrCat("job ", job, " last batch")));
  record.step_after = s.ColumnInt(1);
  record.data_position_after = s.ColumnInt(2);
  record.mid_step_before = s.ColumnInt(3) != 0;
  record.written_ahead = s.ColumnInt(4) != 0;
  record.previous_mid_step_before = s.ColumnInt(5) != 0;
  return record;
}

absl::Status StateStore::PutOperation(const std::string& job,
                                      const std::optional<v1::TrainingOperation>& op) {
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(SynchronousLocked(Synchronous::kFull));
  if (!op.has_value()) {
    return StatementLocked("DELETE FROM operations WHERE job=?1").Text(1, job).Run();
  }
  return StatementLocked(
             "INSERT OR REPLACE INTO operations(job, target_step, micro_steps, started_by, "
             "started_at) VALUES (?1,?2,?3,?4,?5)")
      .Text(1, job)
      .Int(2, op->target_step())
      .Int(3, op->no_sync_micro_steps())
      .Text(4, op->started_by())
      .Real(5, op->started_at_unix())
      .Run();
}

absl::StatusOr<std::optional<v1::TrainingOperation>> StateStore::LoadOperation(
    const std::string& job) const {
  std::lock_guard<std::mutex> lock(mu_);
  SqliteStatement s = StatementLocked(
      "SELECT target_step, micro_steps, started_by, started_at FROM operations "
      "WHERE job=?1");
  s.Text(1, job);
  if (!s.Next()) {
    RETURN_IF_ERROR(s.status());
    return std::nullopt;
  }
  v1::TrainingOperation op;
  op.set_target_step(s.ColumnInt(0));
  op.set_no_sync_micro_steps(static_cast<int>(s.ColumnInt(1)));
  op.set_started_by(s.ColumnString(2));
  op.set_started_at_unix(s.ColumnReal(3));
  op.set_running(true);
  return op;
}

absl::Status StateStore::PutWorker(const WorkerRecord& worker) {
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(SynchronousLocked(Synchronous::kFull));
  return StatementLocked(
             "INSERT OR REPLACE INTO workers(worker_id, host, device, device_name, address, "
             "rank, metrics_address, identity_sha256) VALUES (?1,?2,?3,?4,?5,?6,?7,?8)")
      .Text(1, worker.worker_id)
      .Text(2, worker.host)
      .Text(3, worker.device)
      .Text(4, worker.device_name)
      .Text(5, worker.address)
      .Int(6, worker.rank)
      .Text(7, worker.metrics_address)
      .Text(8, worker.identity_sha256)
      .Run();
}

absl::StatusOr<std::vector<WorkerRecord>> StateStore::LoadWorkers() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<WorkerRecord> workers;
  SqliteStatement s = StatementLocked(
      "SELECT worker_id, host, device, device_name, address, rank, metrics_address, "
      "identity_sha256 FROM workers ORDER BY rank");
  while (s.Next()) {
    WorkerRecord w;
    w.worker_id = s.ColumnString(0);
    w.host = s.ColumnString(1);
    w.device = s.ColumnString(2);
    w.device_name = s.ColumnString(3);
    w.address = s.ColumnString(4);
    w.rank = static_cast<int>(s.ColumnInt(5));
    w.metrics_address = s.ColumnString(6);
    w.identity_sha256 = s.ColumnString(7);
    workers.push_back(std::move(w));
  }
  RETURN_IF_ERROR(s.status());
  return workers;
}

absl::Status StateStore::PutCheckpoints(const std::string& job,
                                        const std::vector<v1::CheckpointInfo>& checkpoints) {
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(SynchronousLocked(Synchronous::kFull));
  RETURN_IF_ERROR(ExecLocked("BEGIN IMMEDIATE"));
  absl::Status status = [&]() -> absl::Status {
    RETURN_IF_ERROR(StatementLocked("DELETE FROM checkpoints WHERE job=?1").Text(1, job).Run());
    for (const v1::CheckpointInfo& c : checkpoints) {
      RETURN_IF_ERROR(StatementLocked("INSERT INTO checkpoints(job, name, step, state_dict_type, "
                                      "world_size, bytes, latest) VALUES (?1,?2,?3,?4,?5,?6,?7)")
                          .Text(1, job)
                          .Text(2, c.name())
                          .Int(3, c.step())
                          .Text(4, v1::StateDictType_Name(c.state_dict_type()))
                          .Int(5, c.world_size())
                          .Int(6, c.bytes())
                          .Int(7, c.latest() ? 1 : 0)
                          .Run());
    }
    return absl::OkStatus();
  }();
  return EndTransactionLocked(status);
}

absl::StatusOr<std::vector<v1::CheckpointInfo>> StateStore::LoadCheckpoints(
    const std::string& job) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<v1::CheckpointInfo> out;
  SqliteStatement s = StatementLocked(
      "SELECT name, step, state_dict_type, world_size, bytes, latest FROM checkpoints "
      "WHERE job=?1 ORDER BY step, name");
  s.Text(1, job);
  while (s.Next()) {
    v1::CheckpointInfo c;
    c.set_name(s.ColumnString(0));
    c.set_step(s.ColumnInt(1));
    v1::StateDictType type = v1::STATE_DICT_TYPE_UNSPECIFIED;
    (void)v1::StateDictType_Parse(s.ColumnString(2), &type);
    c.set_state_dict_type(type);
    c.set_world_size(static_cast<int>(s.ColumnInt(3)));
    c.set_bytes(s.ColumnInt(4));
    c.set_latest(s.ColumnInt(5) != 0);
    out.push_back(std::move(c));
  }
  RETURN_IF_ERROR(s.status());
  return out;
}

}  // namespace flatshard
