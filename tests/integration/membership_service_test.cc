// The coordinator's Membership service over real gRPC: worker processes register,
// get ranks, and rendezvous Gloo through the coordinator's store (GrpcStore),
// then run a collective; bad requests get precise status codes and the server
// keeps serving.
#include "coordinator/service/membership_service.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "rpc/grpc_server.h"

#include "proto/grpc_status.h"
#include "tests/integration/multiprocess.h"
#include "tests/integration/rendezvous_test_util.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/grpc_store.h"

namespace flatshard {
namespace {

using testing::AllRanksSucceeded;
using testing::RegisterSpare;
using testing::RunRanks;

int WorkerBody(int read_fd, int index, int world) {
  int port = 0;
  if (read(read_fd, &port, sizeof(port)) != sizeof(port)) return 2;
  // gRPC starts here, in the child, after the fork.
  auto channel =
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
  auto stub = v1::Membership::NewStub(channel);
  grpc::ClientContext context;
  v1::RegisterRequest request;
  request.set_worker_id(absl::StrCat("worker-", index));
  request.set_address(absl::StrCat("127.0.0.1:", 50000 + index));
  request.set_requested_rank(-1);
  v1::RegisterResponse response;
  CHILD_CHECK(stub->Register(&context, request, &response).ok());
  const int rank = response.rank();
  auto credentials = std::make_shared<WorkerCallCredentials>("");
  credentials->set_session(response.session());
  auto store = std::make_shared<GrpcStore>(channel, credentials);
  auto comm = GlooCommunicator::Create(store, rank, world, GlooOptions{});
  CHILD_OK(comm.status());
  float value = static_cast<float>(rank + 1);
  CHILD_OK((*comm)->AllReduce(&value, 1, DType::kFloat32, ReduceOp::kSum));
  CHILD_CHECK(value == static_cast<float>(world) * static_cast<float>(world + 1) / 2.0f);
  return 0;
}

struct Coordinator {
  MembershipTable members{4};  // 3 workers and the test's own probe
  KvStore store;
  MembershipService service{&members, &store, absl::Seconds(1)};
  std::unique_ptr<GrpcServer> server;
};

TEST(MembershipServiceTest, WorkersRegisterAndRendezvousThroughTheCoordinator) {
  constexpr int kWorld = 3;
  int pipes[kWorld][2];
  for (auto& p : pipes) ASSERT_EQ(pipe(p), 0);
  std::shared_ptr<Coordinator> coordinator;
  // Children fork before gRPC starts any thread here and wait for the port.
  auto results = RunRanks(
      kWorld,
      [&](int index) {
        // Only the parent writes: with its ends closed here, a vanished parent
        // reads as end of file instead of blocking forever.
        for (auto& p : pipes) close(p[1]);
        return WorkerBody(pipes[index][0], index, kWorld);
      },
      absl::Seconds(60),
      [&]() -> std::shared_ptr<void> {
        coordinator = std::make_shared<Coordinator>();
        auto server = GrpcServer::Start("127.0.0.1:0", {&coordinator->service});
        EXPECT_TRUE(server.ok()) << server.status();
        int port = server.ok() ? (*server)->port() : 0;
        if (server.ok()) coordinator->server = *std::move(server);
        for (auto& p : pipes) EXPECT_EQ(write(p[1], &port, sizeof(port)), sizeof(port));
        return coordinator;
      });
  EXPECT_TRUE(AllRanksSucceeded(results));
  ASSERT_NE(coordinator, nullptr);
  const auto workers = coordinator->members.List();
  ASSERT_EQ(workers.size(), 3u);
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(workers[static_cast<size_t>(r)].rank, r);
  EXPECT_GT(coordinator->store.size(), 0u);  // Gloo's rendezvous keys went through it

  // Bad requests: precise codes, and the server keeps serving afterwards.
  auto channel =
      grpc::CreateChannel(coordinator->server->address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Membership::NewStub(channel);
  // A registration of our own, whose session the store calls below carry.
  auto credentials = std::make_shared<WorkerCallCredentials>("");
  absl::StatusOr<std::string> session = RegisterSpare(channel, "probe");
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_EQ(session->size(), 64u);
  credentials->set_session(*session);
  {
    grpc::ClientContext context;
    v1::RegisterRequest request;  // no worker_id
    v1::RegisterResponse response;
    const grpc::Status status = stub->Register(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(status.error_message().find("worker_id"), std::string::npos);
  }
  {
    grpc::ClientContext context;
    credentials->AttachSession(context);
    v1::StoreWaitRequest request;
    request.add_keys("never");
    request.set_timeout_ms(50);
    v1::StoreWaitResponse response;
    EXPECT_EQ(stub->StoreWait(&context, request, &response).error_code(),
              grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  {
    // Store calls are bound to a registration: none, no answer.
    grpc::ClientContext context;
    v1::StoreSetRequest request;
    request.set_key("job/x/forged");
    v1::StoreSetResponse response;
    EXPECT_EQ(stub->StoreSet(&context, request, &response).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_FALSE(coordinator->store.Get("job/x/forged").ok());
  }
  {
    grpc::ClientContext context;
    credentials->AttachSession(context);
    v1::StoreWaitRequest request;
    v1::StoreWaitResponse response;
    EXPECT_EQ(stub->StoreWait(&context, request, &response).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    grpc::ClientContext context;
    v1::HeartbeatRequest request;
    request.set_worker_id("stranger");
    v1::HeartbeatResponse response;
    EXPECT_EQ(stub->Heartbeat(&context, request, &response).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  GrpcStore client(channel, credentials);
  ASSERT_TRUE(client.Set("after/errors", "still serving").ok());
  EXPECT_EQ(*client.Get("after/errors", absl::Seconds(5)), "still serving");
  EXPECT_EQ(*client.Add("after/count", 3), 3);
}

// A worker told to abort while it waits in a rendezvous (a job that failed,
// a daemon shutting down) must not wait out the collective timeout: the wait
// in flight at the coordinator is cancelled, and every later call refused.
TEST(MembershipServiceTest, AnAbortedGrpcStoreLetsGoOfItsWaitAtOnceAndRefusesLaterCalls) {
  Coordinator coordinator;
  auto server = GrpcServer::Start("127.0.0.1:0", {&coordinator.service});
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials());
  auto credentials = std::make_shared<WorkerCallCredentials>("");
  absl::StatusOr<std::string> session = RegisterSpare(channel, "waiter");
  ASSERT_TRUE(session.ok()) << session.status();
  credentials->set_session(*session);
  GrpcStore store(channel, credentials);
  ASSERT_TRUE(store.Set("job/x/1/rank0", "here").ok());

  absl::Status waited;
  absl::Time returned;
  std::thread waiter([&] {
    waited = store.Wait({"job/x/1/rank0", "job/x/1/rank1"}, absl::Seconds(300));
    returned = absl::Now();
  });
  // Bounded: the wait reaches the coordinator's store within a few seconds.
  const absl::Time started = absl::Now();
  while (coordinator.store.waiting() == 0 && absl::Now() - started < absl::Seconds(30)) {
  }
  ASSERT_EQ(coordinator.store.waiting(), 1u) << "the wait never reached the coordinator";
  const absl::Time aborted = absl::Now();
  store.Abort("the job failed: rank 1 missed heartbeats");
  waiter.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kAborted) << waited;
  EXPECT_EQ(waited.message(), "rendezvous store aborted: the job failed: rank 1 missed heartbeats");
  EXPECT_LT(returned - aborted, absl::Seconds(10));  // not the 300 s the wait asked for

  // Every later call is refused without reaching the coordinator.
  const size_t keys = coordinator.store.size();
  EXPECT_EQ(store.Set("job/x/1/rank1", "late").code(), absl::StatusCode::kAborted);
  EXPECT_EQ(store.Get("job/x/1/rank0", absl::Seconds(1)).status().code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(store.Add("job/x/1/count", 1).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(coordinator.store.size(), keys);
  // Another store of the same worker (the next epoch's) is not affected.
  GrpcStore next(channel, credentials);
  EXPECT_EQ(*next.Get("job/x/1/rank0", absl::Seconds(5)), "here");
}

// Each StoreWait holds a server thread for up to 10 minutes: one session has
// at most kMaxWaitsPerSession in flight, another session is not held back by
// it, and a wait that ends frees its slot.
TEST(MembershipServiceTest, ASessionsWaitsInFlightAreBounded) {
  Coordinator coordinator;
  auto server = GrpcServer::Start("127.0.0.1:0", {&coordinator.service});
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Membership::NewStub(channel);
  const auto session_of = [&](const std::string& id) {
    auto credentials = std::make_shared<WorkerCallCredentials>("");
    absl::StatusOr<std::string> session = RegisterSpare(channel, id);
    EXPECT_TRUE(session.ok()) << session.status();
    credentials->set_session(session.value_or(""));
    return credentials;
  };
  const auto wait = [&](WorkerCallCredentials& credentials, const std::string& key,
                        int timeout_ms) {
    grpc::ClientContext context;
    credentials.AttachSession(context);
    v1::StoreWaitRequest request;
    request.add_keys(key);
    request.set_timeout_ms(timeout_ms);
    v1::StoreWaitResponse response;
    return stub->StoreWait(&context, request, &response);
  };
  std::shared_ptr<WorkerCallCredentials> waiter = session_of("waiter");
  constexpr size_t kLimit = MembershipService::kMaxWaitsPerSession;
  std::vector<grpc::Status> waited(kLimit);
  std::vector<std::thread> waiters;
  for (size_t i = 0; i < kLimit; ++i) {
    waiters.emplace_back([&, i] { waited[i] = wait(*waiter, "job/x/1/late", 120000); });
  }
  // Bounded: the waits reach the coordinator's store within a few seconds.
  const absl::Time started = absl::Now();
  while (coordinator.store.waiting() < kLimit && absl::Now() - started < absl::Seconds(30)) {
  }
  ASSERT_EQ(coordinator.store.waiting(), kLimit);
  const grpc::Status refused = wait(*waiter, "job/x/1/late", 1000);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(refused.error_message().find(absl::StrCat("the limit is ", kLimit)), std::string::npos)
      << refused.error_message();
  // Another worker's session waits as ever.
  std::shared_ptr<WorkerCallCredentials> other = session_of("other");
  EXPECT_EQ(wait(*other, "job/x/1/never", 50).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  ASSERT_TRUE(coordinator.store.Set("job/x/1/late", "here").ok());
  for (std::thread& t : waiters) t.join();
  for (size_t i = 0; i < kLimit; ++i) {
    EXPECT_TRUE(waited[i].ok()) << i << ": " << waited[i].error_message();
  }
  // Their slots are free again.
  EXPECT_TRUE(wait(*waiter, "job/x/1/late", 1000).ok());
}

}  // namespace
}  // namespace flatshard
