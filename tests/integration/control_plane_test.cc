// The service end to end: a real coordinator and 4 real worker daemons
// (LocalCluster: child processes, gRPC on loopback, Gloo between the workers),
// driven through libflatshard_client and the `flatshard` CLI. Training through
// the coordinator must give exactly the losses and parameters of the
// data-plane harness (TrainLocalRank) for the same job and seed.
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"

#include "client/child_process.h"
#include "client/flatshard_client.h"
#include "client/local_cluster.h"
#include "coordinator/grpc_worker_client.h"
#include "core/job_config.h"
#include "core/job_spec_yaml.h"
#include "core/step_program.h"
#include "storage/spec_files.h"
#include "tests/integration/multiprocess.h"
#include "tests/integration/rank_results.h"
#include "worker/comm/file_store.h"
#include "worker/service/job_options.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kWorld = 4;
constexpr int kSteps = 30;
const std::string kJobFile = std::string(FLATSHARD_SOURCE_DIR) + "/examples/mlp-job.yaml";

struct CliRun {
  int exit_code = -1;
  std::vector<std::string> lines;
};

// Runs the `flatshard` CLI to completion; its stdout lines and exit code.
CliRun RunCli(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {std::string(FLATSHARD_BIN_DIR) + "/flatshard"};
  argv.insert(argv.end(), args.begin(), args.end());
  CliRun run;
  auto child = ChildProcess::Spawn(argv);
  if (!child.ok()) return run;
  for (;;) {
    absl::StatusOr<std::string> line = (*child)->ReadLine(absl::Seconds(120));
    if (!line.ok()) break;
    run.lines.push_back(*line);
  }
  const std::optional<int> status = (*child)->Wait(absl::Seconds(60));
  if (status.has_value() && WIFEXITED(*status)) run.exit_code = WEXITSTATUS(*status);
  return run;
}

std::string Joined(const CliRun& run) { return absl::StrJoin(run.lines, "\n"); }

// The coordinator drives CPU workers, then simulated-GPU workers: their losses
// must equal the CPU harness's exactly (the sim runs the CPU kernels, in an order
// its event checks prove safe).
class ControlPlaneTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ControlPlaneTest, TrainingThroughTheCoordinatorEqualsTheDataPlaneHarness) {
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecFile(kJobFile);
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<JobConfig> config = JobConfigFromProto(*spec);
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_EQ(config->world_size, kWorld);

  // The expectation first, before this process starts any gRPC thread (the
  // harness forks): 4 ranks of TrainLocalRank over a FileStore.
  const std::string dir = testing::MakeTempDir("control-plane");
  LocalTrainOptions local;
  local.spec = config->model;
  local.policy = config->wrap_policy;
  local.runtime = RuntimeOptionsFromJob(*config);
  absl::StatusOr<compute::DataSourceOptions> data = DataOptionsFromJob(*config, ".");
  ASSERT_TRUE(data.ok()) << data.status();
  local.data = *data;
  local.steps = kSteps;
  auto harness = testing::RunRanks(
      kWorld,
      [&](int rank) {
        auto store = FileStore::Open(dir + "/store");
        CHILD_OK(store.status());
        auto result = TrainLocalRank(local, rank, kWorld, *store);
        CHILD_OK(result.status());
        testing::WriteRankResult(dir, rank, *result);
        return 0;
      },
      absl::Seconds(300));
  ASSERT_TRUE(testing::AllRanksSucceeded(harness));
  std::vector<std::vector<double>> expected(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    expected[static_cast<size_t>(r)] = testing::ReadRankLosses(dir, r);
    ASSERT_EQ(expected[static_cast<size_t>(r)].size(), static_cast<size_t>(kSteps));
  }
  const auto expected_params = testing::ReadFinalParams(dir);
  ASSERT_FALSE(expected_params.empty());

  LocalClusterOptions options;
  options.workers = kWorld;
  options.bin_dir = FLATSHARD_BIN_DIR;
  options.checkpoint_dir = dir + "/checkpoints";
  options.device = GetParam();
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string address = (*cluster)->address();

  // The job is created through the CLI, which waits until it is READY.
  CliRun create = RunCli({"job", "create", "-c", address, "-f", kJobFile});
  ASSERT_EQ(create.exit_code, 0) << Joined(create);
  EXPECT_THAT(Joined(create), HasSubstr("is READY"));
  CliRun again = RunCli({"job", "create", "-c", address, "-f", kJobFile});
  EXPECT_EQ(again.exit_code, 2) << Joined(again);

  FlatshardClient client(address);
  std::vector<v1::StepResult> steps;
  absl::Status trained =
      client.Train(spec->name(), kSteps, 0, [&](const v1::StepResult& r) { steps.push_back(r); });
  ASSERT_TRUE(trained.ok()) << trained;
  ASSERT_EQ(steps.size(), static_cast<size_t>(kSteps));
  uint64_t previous_seq = 0;
  for (int s = 0; s < kSteps; ++s) {
    const v1::StepResult& r = steps[static_cast<size_t>(s)];
    EXPECT_EQ(r.step(), s + 1) << "steps arrive in order";
    EXPECT_GT(r.seq(), previous_seq);
    previous_seq = r.seq();
    ASSERT_EQ(r.rank_losses_size(), kWorld);
    double mean = 0;
    for (int rank = 0; rank < kWorld; ++rank) {
      // Exactly: the same program on the same data, whoever drives it.
      EXPECT_EQ(r.rank_losses(rank), expected[static_cast<size_t>(rank)][static_cast<size_t>(s)])
          << "step " << s + 1 << " rank " << rank;
      mean += expected[static_cast<size_t>(rank)][static_cast<size_t>(s)];
    }
    EXPECT_DOUBLE_EQ(r.loss(), mean / kWorld);
    EXPECT_GT(r.samples_per_second(), 0);
  }
  EXPECT_LT(steps.back().loss(), 0.7 * steps.front().loss()) << "the loss falls";

  // summon_full_params through the coordinator: every parameter, bit for bit.
  std::map<std::string, std::string> summoned;
  absl::Status summon = client.SummonFullParams(
      spec->name(), false, /*chunk_bytes=*/100000, [&](const v1::TensorChunk& chunk) {
        std::string& bytes = summoned[chunk.fqn()];
        EXPECT_EQ(static_cast<int64_t>(bytes.size()), chunk.offset_bytes());
        bytes += chunk.data();
        return absl::OkStatus();
      });
  ASSERT_TRUE(summon.ok()) << summon;
  ASSERT_EQ(summoned.size(), expected_params.size());
  for (const auto& [fqn, values] : expected_params) {
    const std::string want(reinterpret_cast<const char*>(values.data()),
                           values.size() * sizeof(float));
    EXPECT_TRUE(summoned[fqn] == want) << fqn;
  }

  // Manual unshard / reshard by unit; training refuses to run in between.
  ASSERT_TRUE(client.Unshard(spec->name(), {1, 2}).ok());
  absl::Status refused = client.Train(spec->name(), 1, 0, [](const v1::StepResult&) {});
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("reshard"));
  EXPECT_EQ(client.Unshard(spec->name(), {99}).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(client.Reshard(spec->name(), {1, 2}).ok());

  // A batch from a confused coordinator (wrong epoch) is refused by the
  // worker before any collective, and the job carries on.
  auto job = client.GetJob(spec->name());
  ASSERT_TRUE(job.ok());
  GrpcWorkerClient worker((*cluster)->worker_addresses()[0], nullptr, (*cluster)->command_token());
  v1::GetStatusResponse before = *worker.GetStatus(absl::Now() + absl::Seconds(10));
  EXPECT_EQ(before.state(), "ready");
  v1::CommandBatch stale;
  stale.mutable_control();  // an empty control batch: only its epoch is wrong
  stale.set_job_epoch(job->epoch() + 7);
  stale.set_seq(before.last_completed_seq() + 1);
  absl::Notification done;
  absl::Status stale_status;
  worker.Execute(&stale, absl::Now() + absl::Seconds(10),
                 [&](const absl::StatusOr<v1::CommandResult>& r) {
                   stale_status = r.status();
                   done.Notify();
                 });
  done.WaitForNotification();
  EXPECT_EQ(stale_status.code(), absl::StatusCode::kFailedPrecondition) << stale_status;
  EXPECT_THAT(std::string(stale_status.message()), HasSubstr("epoch"));
  // A batch that does not say what it is never reaches the executor.
  v1::CommandBatch kindless;
  kindless.set_job_epoch(job->epoch());
  kindless.set_seq(before.last_completed_seq() + 1);
  absl::Notification kindless_done;
  absl::Status kindless_status;
  worker.Execute(&kindless, absl::Now() + absl::Seconds(10),
                 [&](const absl::StatusOr<v1::CommandResult>& r) {
                   kindless_status = r.status();
                   kindless_done.Notify();
                 });
  kindless_done.WaitForNotification();
  EXPECT_EQ(kindless_status.code(), absl::StatusCode::kInvalidArgument) << kindless_status;
  EXPECT_THAT(std::string(kindless_status.message()), HasSubstr("kind is not set"));

  // The CLI's JSON: one line per step, continuing the step count.
  CliRun train = RunCli({"train", "-c", address, "-j", spec->name(), "--steps", "2", "--json"});
  ASSERT_EQ(train.exit_code, 0) << Joined(train);
  ASSERT_EQ(train.lines.size(), 2u) << Joined(train);
  EXPECT_EQ(nlohmann::json::parse(train.lines[1])["step"], "32");  // int64 is a JSON string
  CliRun workers = RunCli({"workers", "-c", address});
  ASSERT_EQ(workers.exit_code, 0);
  EXPECT_EQ(workers.lines.size(), static_cast<size_t>(kWorld + 1)) << Joined(workers);
  const std::string out = dir + "/model.safetensors";
  CliRun write = RunCli({"summon", "-c", address, "-j", spec->name(), "--out", out});
  ASSERT_EQ(write.exit_code, 0) << Joined(write);
  std::ifstream file(out, std::ios::binary);
  uint64_t header_size = 0;
  file.read(reinterpret_cast<char*>(&header_size), 8);
  std::string header(header_size, ' ');
  file.read(header.data(), static_cast<std::streamsize>(header_size));
  const nlohmann::json parsed = nlohmann::json::parse(header);
  for (const auto& [fqn, values] : expected_params) {
    ASSERT_TRUE(parsed.contains(fqn)) << fqn;
    EXPECT_EQ(parsed[fqn]["dtype"], "F32");
  }
  CliRun status = RunCli({"job", "status", "-c", address, "-j", spec->name()});
  EXPECT_EQ(status.exit_code, 0);
  EXPECT_THAT(Joined(status), HasSubstr("IDLE"));
  // Trained since its initialization, never saved.
  EXPECT_THAT(Joined(status), HasSubstr("saved as:   (no checkpoint holds this state"));
  CliRun missing = RunCli({"job", "status", "-c", address, "-j", "nope"});
  EXPECT_EQ(missing.exit_code, 2);
  // `ckpt ls` names what a recovery restores: after a load of the older of
  // two checkpoints, that one, not the latest.
  for (const char* name : {"first", "second"}) {
    CliRun saved = RunCli({"ckpt", "save", "-c", address, "-j", spec->name(), "-n", name});
    ASSERT_EQ(saved.exit_code, 0) << Joined(saved);
    CliRun stepped = RunCli({"train", "-c", address, "-j", spec->name(), "--steps", "1"});
    ASSERT_EQ(stepped.exit_code, 0) << Joined(stepped);
  }
  CliRun listed = RunCli({"ckpt", "ls", "-c", address, "-j", spec->name()});
  EXPECT_THAT(Joined(listed), HasSubstr("second (latest)"));
  EXPECT_THAT(Joined(listed), HasSubstr("a recovery (or the job's next start) restores 'second'"));
  CliRun loaded = RunCli({"ckpt", "load", "-c", address, "-j", spec->name(), "first"});
  ASSERT_EQ(loaded.exit_code, 0) << Joined(loaded);
  listed = RunCli({"ckpt", "ls", "-c", address, "-j", spec->name()});
  EXPECT_THAT(Joined(listed), HasSubstr("a recovery (or the job's next start) restores 'first'"));
  // Deleted and created again: the checkpoints in its directory are the
  // earlier job's, listed, but not its history until it loads one.
  CliRun deleted = RunCli({"job", "delete", "-c", address, "-j", spec->name()});
  ASSERT_EQ(deleted.exit_code, 0) << Joined(deleted);
  CliRun recreated = RunCli({"job", "create", "-c", address, "-f", kJobFile});
  ASSERT_EQ(recreated.exit_code, 0) << Joined(recreated);
  listed = RunCli({"ckpt", "ls", "-c", address, "-j", spec->name()});
  EXPECT_THAT(Joined(listed), HasSubstr("second"));
  EXPECT_THAT(Joined(listed), HasSubstr("none of these is one a recovery would restore now"));
  EXPECT_THAT(Joined(listed), Not(HasSubstr("restores '")));

  EXPECT_TRUE((*cluster)->Stop()) << "every daemon exits 0 on SIGTERM";
  CliRun unreachable = RunCli({"workers", "-c", address});
  EXPECT_EQ(unreachable.exit_code, 3);
}

INSTANTIATE_TEST_SUITE_P(Devices, ControlPlaneTest, ::testing::Values("cpu", "sim"),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           return p.param == "sim" ? std::string("SimDevice") : std::string("Cpu");
                         });

}  // namespace
}  // namespace flatshard
