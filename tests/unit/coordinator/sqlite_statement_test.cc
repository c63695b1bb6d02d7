// SqliteStatementCache on a real SQLite connection: a text is prepared once
// however often it runs, a statement comes back reset and unbound, and a text
// that does not prepare carries its error without poisoning the cache.
#include "coordinator/sqlite_statement.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>

namespace flatshard {
namespace {

using ::testing::HasSubstr;

class SqliteStatementCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(sqlite3_open(":memory:", &db_), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db_, "CREATE TABLE t(k INTEGER PRIMARY KEY, v TEXT)", nullptr, nullptr,
                           nullptr),
              SQLITE_OK);
  }
  void TearDown() override { EXPECT_EQ(sqlite3_close(db_), SQLITE_OK); }

  // The connection's prepared statements (finalized ones are gone).
  int Prepared() const {
    int n = 0;
    for (sqlite3_stmt* s = sqlite3_next_stmt(db_, nullptr); s != nullptr;
         s = sqlite3_next_stmt(db_, s)) {
      ++n;
    }
    return n;
  }

  sqlite3* db_ = nullptr;
};

TEST_F(SqliteStatementCacheTest, ATextIsPreparedOnceAndFinalizedWithTheCache) {
  {
    SqliteStatementCache cache(db_);
    for (int k = 0; k < 5; ++k) {
      ASSERT_TRUE(
          cache.Get("INSERT INTO t(k, v) VALUES (?1, ?2)").Int(1, k).Text(2, "x").Run().ok());
    }
    SqliteStatement count = cache.Get("SELECT count(*) FROM t");
    ASSERT_TRUE(count.Next());
    EXPECT_EQ(count.ColumnInt(0), 5);
    EXPECT_EQ(Prepared(), 2);
  }
  // Gone with the cache, so the connection closes (TearDown checks it does).
  EXPECT_EQ(Prepared(), 0);
}

TEST_F(SqliteStatementCacheTest, AStatementComesBackResetAndUnbound) {
  SqliteStatementCache cache(db_);
  const char* insert = "INSERT INTO t(k, v) VALUES (?1, ?2)";
  ASSERT_TRUE(cache.Get(insert).Int(1, 1).Text(2, "first").Run().ok());
  // ?2 not bound this time: NULL, not the last use's "first".
  ASSERT_TRUE(cache.Get(insert).Int(1, 2).Run().ok());
  const char* select = "SELECT v FROM t WHERE k=?1";
  {
    SqliteStatement s = cache.Get(select);
    ASSERT_TRUE(s.Int(1, 2).Next());
    EXPECT_TRUE(s.ColumnNull(0));
  }
  {
    // Left after its first row last time: reset, it starts from the top.
    SqliteStatement s = cache.Get("SELECT k FROM t ORDER BY k");
    ASSERT_TRUE(s.Next());
    EXPECT_EQ(s.ColumnInt(0), 1);
  }
  SqliteStatement s = cache.Get("SELECT k FROM t ORDER BY k");
  ASSERT_TRUE(s.Next());
  EXPECT_EQ(s.ColumnInt(0), 1);
}

TEST_F(SqliteStatementCacheTest, ATextThatDoesNotPrepareCarriesItsError) {
  SqliteStatementCache cache(db_);
  const absl::Status bad = cache.Get("SELECT nope FROM t").Int(1, 3).Run();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(bad.message(), HasSubstr("no such column: nope"));
  EXPECT_EQ(Prepared(), 0);  // not kept
  // A failed step (a constraint) does not stick to the statement either.
  const char* insert = "INSERT INTO t(k, v) VALUES (?1, ?2)";
  ASSERT_TRUE(cache.Get(insert).Int(1, 7).Text(2, "a").Run().ok());
  EXPECT_FALSE(cache.Get(insert).Int(1, 7).Text(2, "b").Run().ok());
  EXPECT_TRUE(cache.Get(insert).Int(1, 8).Text(2, "c").Run().ok());
}

}  // namespace
}  // namespace flatshard
