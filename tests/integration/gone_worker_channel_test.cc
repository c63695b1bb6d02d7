// A recovery lets the channel of a worker it found gone go at once
// (WorkerClient::Disconnect), whatever the channel's idle timeout. The dead
// worker's port is free for the kernel to hand to the next socket bound on
// its host, a survivor's Gloo pair listener among them, and a coordinator
// still dialing the address takes the one accept that pair waits for from
// its peer (docs/fault-tolerance.md). At 16,384 workers a channel idles only
// after 33.8 s (WorkerChannelIdle), so without Disconnect it redials the
// dead address through the whole re-formation.
//
// A coordinator in this process, its channels idling as a 16,384-worker
// job's do, drives two real worker daemons; rank 1's is SIGKILLed while
// training. While the recovery waits for a spare that never comes (then
// shrinks the job), the test listens on the dead worker's port: from a
// second after the job went RECOVERING (its abort and probe are over by
// then), nothing dials it.
#include <csignal>
#include <future>
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

#include "client/child_process.h"
#include "client/flatshard_client.h"
#include "coordinator/grpc_worker_client.h"
#include "storage/spec_files.h"
#include "tests/integration/in_process_coordinator.h"
#include "tests/integration/multiprocess.h"
#include "tests/integration/port_dials.h"

namespace flatshard {
namespace {

TEST(GoneWorkerChannelTest, ARecoveryStopsDialingTheAddressOfTheWorkerItLost) {
  const std::string dir = testing::MakeTempDir("gone-worker-channel");
  CoordinatorOptions options;
  options.heartbeat_interval = absl::Milliseconds(250);
  options.heartbeat_timeout = absl::Seconds(2);
  options.job.checkpoint_root = dir + "/checkpoints";
  constexpr size_t kScale = 16384;
  options.job.connect = [](const WorkerRecord& w, size_t) -> std::unique_ptr<WorkerClient> {
    return std::make_unique<GrpcWorkerClient>(w.address, nullptr, w.command_token,
                                              WorkerChannelIdle(kScale));
  };
  auto coordinator = testing::InProcessCoordinator::Start(options);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  std::vector<std::unique_ptr<ChildProcess>> workers;
  for (int i = 0; i < 2; ++i) {
    auto worker = ChildProcess::Spawn(
        {std::string(FLATSHARD_BIN_DIR) + "/flatshard-worker", "--coordinator",
         (*coordinator)->address(), "--rank", absl::StrCat(i), "--state-dir",
         absl::StrCat(dir, "/worker-", i), "--checkpoint-dir", dir + "/checkpoints",
         "--metrics-listen", "", "--compute-threads", "1"});
    ASSERT_TRUE(worker.ok()) << worker.status();
    auto banner = (*worker)->ReadLine(absl::Seconds(60));  // registered and serving
    ASSERT_TRUE(banner.ok()) << banner.status();
    workers.push_back(*std::move(worker));
  }
  auto spec = LoadJobSpecFile(std::string(FLATSHARD_SOURCE_DIR) + "/examples/mlp-job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  spec->set_world_size(2);
  spec->mutable_recovery()->set_max_restarts(2);
  spec->mutable_recovery()->set_spare_wait_s(4);  // the window listened in
  FlatshardClient client((*coordinator)->address());
  ASSERT_TRUE(client.CreateJob(*spec).ok());
  ASSERT_TRUE(client.WaitForState(spec->name(), {v1::READY}, absl::Seconds(120)).ok());

  // The daemon started with --rank 1 holds rank 1; its gRPC port is the
  // address the coordinator dials.
  auto listed = client.ListWorkers(spec->name());
  ASSERT_TRUE(listed.ok()) << listed.status();
  int dead_port = 0;
  for (const v1::WorkerInfo& w : *listed) {
    if (w.rank() != 1) continue;
    const std::string& address = w.address();
    ASSERT_TRUE(absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &dead_port)) << address;
  }
  ASSERT_GT(dead_port, 0) << "no worker holds rank 1";

  std::future<absl::Status> trained = std::async(std::launch::async, [&] {
    int results = 0;
    return client.Train(spec->name(), 6, 0, [&](const v1::StepResult&) {
      if (++results == 2) workers[1]->Signal(SIGKILL);
    });
  });
  absl::StatusOr<v1::JobState> recovering =
      client.WaitForState(spec->name(), {v1::RECOVERING}, absl::Seconds(60));
  ASSERT_TRUE(recovering.ok()) << recovering.status();
  const absl::Time began = absl::Now();
  absl::StatusOr<std::vector<std::vector<absl::Duration>>> listened =
      testing::DialsUntil({dead_port}, began, began + absl::Milliseconds(3500));
  ASSERT_TRUE(listened.ok()) << listened.status();
  int late = 0;
  for (absl::Duration at : (*listened)[0]) {
    std::cout << "the dead worker's port dialed " << absl::FormatDuration(at)
              << " after the job went RECOVERING\n";
    if (at >= absl::Seconds(1)) ++late;
  }
  EXPECT_EQ(late, 0) << "the coordinator still dials the address of the worker it lost";

  // The recovery goes on: no spare, so the job shrinks and trains on.
  const absl::Status status = trained.get();
  ASSERT_TRUE(status.ok()) << status;
  absl::StatusOr<v1::Job> job = client.GetJob(spec->name());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->restarts(), 1);
  EXPECT_EQ(job->world_size(), 1);
  EXPECT_THAT(job->last_recovery().failed_ranks(), ::testing::ElementsAre(1));

  coordinator->reset();  // the job's end first: the workers' calls into it return
  workers.clear();       // each is terminated (SIGTERM) and waited for
}

}  // namespace
}  // namespace flatshard
