// A worker's heartbeat loop against the coordinator's real Membership service
// over gRPC: beats keep coming at the interval however often batches end.
#include "worker/service/heartbeat_loop.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "rpc/grpc_server.h"

#include "coordinator/kv_store.h"
#include "coordinator/membership.h"
#include "coordinator/service/membership_service.h"

namespace flatshard {
namespace {

struct Cluster {
  explicit Cluster(absl::Duration interval) : service(&members, &store, interval) {}

  MembershipTable members{1};
  KvStore store;
  MembershipService service;
  std::unique_ptr<GrpcServer> server;
  WorkerServiceImpl worker{WorkerServiceOptions{}};
  std::unique_ptr<HeartbeatLoop> heartbeat;

  absl::Status Start() {
    absl::StatusOr<std::unique_ptr<GrpcServer>> started =
        GrpcServer::Start("127.0.0.1:0", {&service});
    if (!started.ok()) return started.status();
    server = *std::move(started);
    auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server->port()),
                                       grpc::InsecureChannelCredentials());
    v1::RegisterRequest registration;
    registration.set_worker_id("worker-0");
    registration.set_address("127.0.0.1:1");
    registration.set_requested_rank(-1);
    heartbeat = std::make_unique<HeartbeatLoop>(channel, registration, &worker,
                                                std::make_shared<WorkerCallCredentials>(""));
    absl::StatusOr<int> rank = heartbeat->Register(absl::Seconds(10));
    if (!rank.ok()) return rank.status();
    heartbeat->Start();
    return absl::OkStatus();
  }

  absl::Time LastHeartbeat() const { return members.List().at(0).last_heartbeat; }
};

// Steps shorter than the loop's settle window (100 ms) end a batch inside
// every window. The loop once waited for a window without one before beating,
// so fast training starved the heartbeat and the coordinator failed live
// workers for missed heartbeats.
TEST(HeartbeatLoopTest, BeatsKeepTheirIntervalWhileBatchesEndEveryFewMilliseconds) {
  constexpr absl::Duration kInterval = absl::Milliseconds(200);
  Cluster cluster(kInterval);
  ASSERT_TRUE(cluster.Start().ok());
  const absl::Time registered = cluster.LastHeartbeat();
  absl::Duration stalest;
  const absl::Time until = absl::Now() + 20 * kInterval;
  while (absl::Now() < until) {
    cluster.heartbeat->BatchEnded();  // a 20 ms training step just ended
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    stalest = std::max(stalest, absl::Now() - cluster.LastHeartbeat());
  }
  cluster.heartbeat->Stop();
  EXPECT_GT(cluster.LastHeartbeat(), registered + 15 * kInterval) << "beats stopped arriving";
  // An interval plus scheduling slack on a loaded machine; the starved loop
  // went the whole 4 s without one.
  EXPECT_LT(stalest, 5 * kInterval) << "the coordinator went " << stalest << " without a beat";
}

// A batch that ends and is not followed by another within the settle window
// means training finished: the worker reports it at once, not an interval later.
TEST(HeartbeatLoopTest, AWorkerThatStaysIdleAfterABatchBeatsBeforeTheInterval) {
  constexpr absl::Duration kInterval = absl::Seconds(1);
  Cluster cluster(kInterval);
  ASSERT_TRUE(cluster.Start().ok());
  const absl::Time first = cluster.LastHeartbeat();
  // Wait for the first beat after registration, then end a batch right after it.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (cluster.LastHeartbeat() == first && absl::Now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const absl::Time beat = cluster.LastHeartbeat();
  ASSERT_GT(beat, first);
  cluster.heartbeat->BatchEnded();
  while (cluster.LastHeartbeat() == beat && absl::Now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  cluster.heartbeat->Stop();
  // The settle window (100 ms) and a loopback RPC, well short of the interval.
  EXPECT_LT(cluster.LastHeartbeat() - beat, kInterval / 2);
}

}  // namespace
}  // namespace flatshard
