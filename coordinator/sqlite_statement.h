// One prepared SQLite statement, finalized on scope exit, whose binds and
// steps carry the first failure to status() instead of each call returning
// one: a statement is built, run and checked once (StateStore's queries).
#ifndef FLATSHARD_COORDINATOR_SQLITE_STATEMENT_H_
#define FLATSHARD_COORDINATOR_SQLITE_STATEMENT_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include <sqlite3.h>

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
  SqliteStatement(sqlite3* db, const char* sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
  }
  ~SqliteStatement() { sqlite3_finalize(stmt_); }
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
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_SQLITE_STATEMENT_H_
