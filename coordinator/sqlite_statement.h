// One prepared SQLite statement whose binds and steps carry the first failure
// to status() instead of each call returning one: a statement is built, run
// and checked once (StateStore's queries). Statements come from a
// SqliteStatementCache, which prepares each SQL text once per connection: a
// statement run on every training step (the batch journal) is then not parsed
// and planned again each time, which cost more than its commit.
#ifndef FLATSHARD_COORDINATOR_SQLITE_STATEMENT_H_
#define FLATSHARD_COORDINATOR_SQLITE_STATEMENT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include <sqlite3.h>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace flatshard {

// A failed SQLite call (`rc`, its message, `where` it failed) as a Status
// whose code says what a caller can do: another process holding the database
// (busy, locked) is UNAVAILABLE and worth a retry, a full disk
// RESOURCE_EXHAUSTED.
inline absl::Status SqliteStatus(int rc, absl::string_view where, const char* message) {
  const std::string what = absl::StrCat(where, ": ", message == nullptr ? "error" : message);
  switch (rc & 0xff) {  // the primary code of an extended one
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return absl::UnavailableError(what);
    case SQLITE_FULL:
      return absl::ResourceExhaustedError(what);
    default:
      return absl::InternalError(what);
  }
}

class SqliteStatement {
 public:
  // Borrows `stmt` (a cache's, prepared with result `rc`): reset and unbound,
  // not finalized, on scope exit, so the next use starts clean.
  SqliteStatement(sqlite3* db, sqlite3_stmt* stmt, int rc) : db_(db), stmt_(stmt), rc_(rc) {}
  ~SqliteStatement() {
    if (stmt_ == nullptr) return;  // it did not prepare
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
  SqliteStatement(const SqliteStatement&) = delete;
  SqliteStatement& operator=(const SqliteStatement&) = delete;

  SqliteStatement& Text(int i, const std::string& v) {
    Check(sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT));
    return *this;
  }
  SqliteStatement& Blob(int i, const std::string& v) {
    Check(sqlite3_bind_blob(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT));
    return *this;
  }
  SqliteStatement& Int(int i, int64_t v) {
    Check(sqlite3_bind_int64(stmt_, i, v));
    return *this;
  }
  SqliteStatement& Real(int i, double v) {
    Check(sqlite3_bind_double(stmt_, i, v));
    return *this;
  }
  SqliteStatement& Null(int i) {
    Check(sqlite3_bind_null(stmt_, i));
    return *this;
  }
  // True while a row is there; a failure ends the rows and shows in status().
  bool Next() {
    if (rc_ != SQLITE_OK && rc_ != SQLITE_ROW) return false;
    rc_ = sqlite3_step(stmt_);
    return rc_ == SQLITE_ROW;
  }
  absl::Status Run() {
    Next();
    return status();
  }
  absl::Status status() const {
    if (rc_ == SQLITE_OK || rc_ == SQLITE_ROW || rc_ == SQLITE_DONE) return absl::OkStatus();
    return SqliteStatus(rc_, "state store", sqlite3_errmsg(db_));
  }
  int64_t ColumnInt(int i) const { return sqlite3_column_int64(stmt_, i); }
  double ColumnReal(int i) const { return sqlite3_column_double(stmt_, i); }
  bool ColumnNull(int i) const { return sqlite3_column_type(stmt_, i) == SQLITE_NULL; }
  std::string ColumnString(int i) const {
    const void* data = sqlite3_column_blob(stmt_, i);
    const int size = sqlite3_column_bytes(stmt_, i);
    return data == nullptr ? std::string()
                           : std::string(static_cast<const char*>(data), static_cast<size_t>(size));
  }

 private:
  void Check(int rc) {
    if (rc_ == SQLITE_OK) rc_ = rc;
  }
  sqlite3* db_;
  sqlite3_stmt* stmt_;
  int rc_;
};

// The prepared statements of one connection, by SQL text, kept until the
// cache is destroyed (which must happen before sqlite3_close: a connection
// with statements left refuses to close). Not thread-safe, and one statement
// is in use at a time per text: its owner serializes (StateStore's mu_).
class SqliteStatementCache {
 public:
  explicit SqliteStatementCache(sqlite3* db) : db_(db) {}
  ~SqliteStatementCache() {
    for (auto& [sql, stmt] : statements_) sqlite3_finalize(stmt);
  }
  SqliteStatementCache(const SqliteStatementCache&) = delete;
  SqliteStatementCache& operator=(const SqliteStatementCache&) = delete;

  // `sql` prepared (once) for this use. A text that does not prepare is not
  // kept: the statement carries the failure to its status().
  SqliteStatement Get(const char* sql) {
    auto it = statements_.find(sql);
    if (it != statements_.end()) return SqliteStatement(db_, it->second, SQLITE_OK);
    sqlite3_stmt* stmt = nullptr;
    const int rc = sqlite3_prepare_v3(db_, sql, -1, SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
    if (rc == SQLITE_OK && stmt != nullptr) statements_.emplace(sql, stmt);
    return SqliteStatement(db_, stmt, rc);
  }

 private:
  sqlite3* db_;
  absl::flat_hash_map<std::string, sqlite3_stmt*> statements_;
};

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_SQLITE_STATEMENT_H_
