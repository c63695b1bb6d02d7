// What a worker keeps of in-memory peer snapshots (worker/service/peer_snapshot_store.h):
// the last three generations of each kind, one job's only, and nothing of an
// earlier incarnation of the job once it is configured again. (The exchange
// between real processes: tests/integration/peer_snapshot_recovery_test.cc.)
#include "worker/service/peer_snapshot_store.h"

#include <gtest/gtest.h>

namespace flatshard {
namespace {

std::shared_ptr<const std::string> Bytes(const std::string& s) {
  return std::make_shared<const std::string>(s);
}

void Take(PeerSnapshotStore& store, const std::string& job, uint64_t epoch, int64_t step) {
  // World size 1: no neighbour, so no exchange and no communicator.
  store.Take(job, PeerSnapshotInfo{epoch, step, 0, 1, 1}, Bytes(job + std::to_string(step)),
             nullptr);
}

TEST(PeerSnapshotStoreTest, KeepsTheLastGenerationsTaken) {
  PeerSnapshotStore store(/*keep=*/2);
  for (int64_t step = 1; step <= 3; ++step) Take(store, "j", 1, step);
  EXPECT_EQ(store.Find("j", 1, 1, 0), nullptr);
  ASSERT_NE(store.Find("j", 1, 2, 0), nullptr);
  EXPECT_EQ(*store.Find("j", 1, 3, 0), "j3");
  EXPECT_EQ(store.Find("j", 1, 3, 1), nullptr);  // another rank's
  EXPECT_EQ(store.Find("j", 2, 3, 0), nullptr);  // another epoch's
  EXPECT_EQ(store.Held().size(), 2u);
  EXPECT_EQ(store.bytes(), 4);
  // After a rollback a step number repeats: the one taken last is kept.
  Take(store, "j", 2, 2);
  EXPECT_EQ(store.Find("j", 1, 2, 0), nullptr);
  EXPECT_NE(store.Find("j", 1, 3, 0), nullptr);
  EXPECT_NE(store.Find("j", 2, 2, 0), nullptr);
}

TEST(PeerSnapshotStoreTest, AnotherJobOrANewIncarnationDropsThem) {
  PeerSnapshotStore store;
  Take(store, "a", 3, 7);
  Take(store, "b", 1, 1);  // one job at a time on a worker
  EXPECT_EQ(store.Find("a", 3, 7, 0), nullptr);
  EXPECT_NE(store.Find("b", 1, 1, 0), nullptr);
  // A recovery configures a later epoch: the snapshots stay for its restore.
  store.Configuring("b", 2);
  EXPECT_NE(store.Find("b", 1, 1, 0), nullptr);
  // "b" deleted and created again starts over at epoch 1: they go.
  store.Configuring("b", 1);
  EXPECT_TRUE(store.Held().empty());
}

}  // namespace
}  // namespace flatshard
