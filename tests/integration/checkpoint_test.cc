// Checkpoints end to end (issue #5, docs/architecture.md §6, docs/fsdp-semantics.md §5–6): real
// coordinators and worker daemons (LocalCluster), real files on disk. SHARDED
// checkpoints reload at other world sizes bit for bit, FULL equals the
// summoned model, LOCAL refuses another world size, resuming continues
// training exactly, damaged files are refused by name, and a second client
// can checkpoint a job another client is training. The failure paths (a
// worker killed mid-save, a full disk): checkpoint_faults_test.cc.
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/wait.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

#include "client/child_process.h"
#include "client/flatshard_client.h"
#include "client/local_cluster.h"
#include "core/job_spec_yaml.h"
#include "storage/checkpoint_convert.h"
#include "storage/checkpoint_reader.h"
#include "storage/durable_file.h"
#include "storage/safetensors_reader.h"
#include "tests/integration/checkpoint_harness.h"
#include "tests/integration/multiprocess.h"

namespace flatshard {
namespace {

namespace fs = std::filesystem;
using checkpoint_testing::BinDir;
using checkpoint_testing::Dir;
using checkpoint_testing::ExpectSameTensors;
using checkpoint_testing::kJob;
using checkpoint_testing::ReadTensors;
using checkpoint_testing::Save;
using checkpoint_testing::Spec;
using checkpoint_testing::Start;
using checkpoint_testing::Train;
using ::testing::HasSubstr;

// The ranks that wrote (part of) manifest file `name`.
std::set<int> WritersOf(const CheckpointManifest& manifest, absl::string_view name) {
  std::set<int> writers;
  for (const CheckpointFile& f : manifest.files) {
    if (f.name == name) writers.insert(f.rank);
  }
  return writers;
}

// `flatshard ckpt verify DIR`, run as a user would: its exit code and output.
struct VerifyRun {
  int exit_code = -1;
  std::string output;
};
absl::StatusOr<VerifyRun> RunVerify(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<ChildProcess>> verify =
      ChildProcess::Spawn({BinDir() + "/flatshard", "ckpt", "verify", dir});
  if (!verify.ok()) return verify.status();
  VerifyRun run;
  while (true) {
    absl::StatusOr<std::string> line = (*verify)->ReadLine(absl::Seconds(60));
    if (!line.ok()) break;
    run.output += *line + "\n";
  }
  const std::optional<int> status = (*verify)->Wait(absl::Seconds(60));
  if (!status.has_value()) return absl::DeadlineExceededError("ckpt verify did not exit");
  run.exit_code = WEXITSTATUS(*status);
  return run;
}

class CheckpointTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    // The cuda instances run where scripts/gpu-check.sh runs them: on a
    // machine with an NVIDIA GPU, every rank's worker on GPU 0 (Gloo staged
    // through pinned memory between them).
    if (GetParam() == "cuda" && !fs::exists("/dev/nvidia0")) {
      GTEST_SKIP() << "no NVIDIA GPU on this machine (/dev/nvidia0)";
    }
  }
};

// A conversion whose writes fail part way (here past `model_bytes`, the
// file-size limit's EFBIG standing in for a full disk: the model file is
// written, the optimizer file fails) fails naming why, and leaves neither
// the output nor its partial directory, whose finished files would hold the
// space.
void ExpectFailedConversionLeavesNothing(const std::string& source, const std::string& out,
                                         uint64_t model_bytes) {
  struct rlimit before = {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &before), 0);
  struct rlimit limited = before;
  limited.rlim_cur = model_bytes + 4096;
  // EFBIG rather than the signal that would end this test.
  void (*const sigxfsz)(int) = std::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limited), 0);
  absl::StatusOr<CheckpointManifest> written = ConsolidateCheckpoint(source, out);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &before), 0);
  std::signal(SIGXFSZ, sigxfsz);
  ASSERT_FALSE(written.ok());
  EXPECT_EQ(written.status().code(), absl::StatusCode::kUnavailable) << written.status();
  EXPECT_THAT(std::string(written.status().message()), HasSubstr(std::strerror(EFBIG)));
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".partial"));
}

TEST_P(CheckpointTest, ShardedReloadsAtOtherWorldSizesBitForBitAndLocalDoesNot) {
  const std::string root = testing::MakeTempDir("ckpt-reshard") + "/checkpoints";
  {
    auto four = Start(Spec(4, false), root, GetParam());
    ASSERT_NE(four, nullptr);
    Train(*four->client, 3);  // so the optimizer has state to save
    ASSERT_TRUE(Save(*four->client, "sharded4", v1::SHARDED_STATE_DICT).ok());
    ASSERT_TRUE(Save(*four->client, "full4", v1::FULL_STATE_DICT).ok());
    ASSERT_TRUE(Save(*four->client, "local4", v1::LOCAL_STATE_DICT).ok());
    EXPECT_EQ(Save(*four->client, "full4", v1::FULL_STATE_DICT).status().code(),
              absl::StatusCode::kAlreadyExists);

    // FULL written by 4 workers is the unsharded model: what summon gathers.
    std::map<std::string, std::string> summoned;
    ASSERT_TRUE(four->client
                    ->SummonFullParams(kJob, false, 0,
                                       [&](const v1::TensorChunk& chunk) {
                                         summoned[chunk.fqn()] += chunk.data();
                                         return absl::OkStatus();
                                       })
                    .ok());
    const auto full = ReadTensors(Dir(root, "full4") + "/model.safetensors");
    ASSERT_EQ(full.size(), summoned.size());
    for (const auto& [fqn, bytes] : summoned) {
      ASSERT_TRUE(full.contains(fqn)) << fqn;
      EXPECT_TRUE(full.at(fqn).data == bytes) << fqn;
    }
  }
  for (int world : {2, 3}) {
    SCOPED_TRACE(absl::StrCat("world size ", world));
    // Another wrap policy too: W=2 has only the root unit, W=3 keeps the units
    // but flattens with use_orig_params' alignment padding.
    v1::JobSpec spec = Spec(world, false);
    if (world == 2) spec.clear_wrap_policy();
    if (world == 3) spec.mutable_sharding()->set_use_orig_params(true);
    auto cluster = Start(spec, root, GetParam());
    ASSERT_NE(cluster, nullptr);
    absl::StatusOr<v1::CheckpointProgress> local = cluster->client->LoadCheckpoint(kJob, "local4");
    ASSERT_FALSE(local.ok());
    EXPECT_EQ(local.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(local.status().message()),
                HasSubstr("LOCAL_STATE_DICT saved at world size 4"));
    EXPECT_THAT(std::string(local.status().message()), HasSubstr("SHARDED or FULL"));

    ASSERT_TRUE(cluster->client->LoadCheckpoint(kJob, "sharded4").ok());
    const std::string again = absl::StrCat("full-from-sharded4-at-", world);
    ASSERT_TRUE(Save(*cluster->client, again, v1::FULL_STATE_DICT).ok());
    ExpectSameTensors(Dir(root, "full4") + "/model.safetensors",
                      Dir(root, again) + "/model.safetensors");
    ExpectSameTensors(Dir(root, "full4") + "/optim.safetensors",
                      Dir(root, again) + "/optim.safetensors");
    // FULL loads at any world size too, and the job keeps training.
    ASSERT_TRUE(cluster->client->LoadCheckpoint(kJob, "full4").ok());
    EXPECT_EQ(Train(*cluster->client, 1).at(0).step(), 4);
  }
  // Offline, no cluster: SHARDED and LOCAL consolidate to the FULL the cluster
  // wrote, and a reshard to W=3 consolidates back to it too.
  const std::string offline = absl::StrCat(root, "/", kJob);
  for (const char* source : {"sharded4", "local4"}) {
    const std::string out = absl::StrCat(offline, "/consolidated-", source);
    absl::StatusOr<CheckpointManifest> written = ConsolidateCheckpoint(Dir(root, source), out);
    ASSERT_TRUE(written.ok()) << written.status();
    EXPECT_EQ(written->state_dict_type, v1::FULL_STATE_DICT);
    ExpectSameTensors(Dir(root, "full4") + "/model.safetensors", out + "/model.safetensors");
    ExpectSameTensors(Dir(root, "full4") + "/optim.safetensors", out + "/optim.safetensors");
  }
  ASSERT_TRUE(ReshardCheckpoint(Dir(root, "full4"), offline + "/w3", 3).ok());
  EXPECT_TRUE(fs::exists(offline + "/w3/model-rank00002-of-00003.safetensors"));
  ASSERT_TRUE(ConsolidateCheckpoint(offline + "/w3", offline + "/w3-full").ok());
  ExpectSameTensors(Dir(root, "full4") + "/optim.safetensors",
                    offline + "/w3-full/optim.safetensors");
  EXPECT_EQ(ConsolidateCheckpoint(Dir(root, "sharded4"), offline + "/w3").status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(ReshardCheckpoint(Dir(root, "full4"), offline + "/w0", 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  // `-o dir/` names `dir`, as the source path may end in a slash too.
  absl::StatusOr<CheckpointManifest> slashed =
      ReshardCheckpoint(Dir(root, "full4") + "/", offline + "/w2/", 2);
  ASSERT_TRUE(slashed.ok()) << slashed.status();
  EXPECT_EQ(slashed->name, "w2");
  EXPECT_TRUE(fs::exists(offline + "/w2/manifest.json"));
  ExpectFailedConversionLeavesNothing(Dir(root, "sharded4"), offline + "/too-big",
                                      fs::file_size(Dir(root, "full4") + "/model.safetensors"));
}

// Under HYBRID_SHARD the two replicas of a shard hold the same elements and
// each writes half of them: the SHARDED files of a 2 x 2 job tile every tensor
// (a gap or an overlap would fail the consolidation with DATA_LOSS), every
// rank writes a share, and they consolidate to the FULL checkpoint it writes.
TEST_P(CheckpointTest, HybridShardedSaveConsolidatesToItsFullSave) {
  const std::string root = testing::MakeTempDir("ckpt-hybrid") + "/checkpoints";
  v1::JobSpec spec = Spec(4, false);
  spec.mutable_sharding()->set_strategy(v1::HYBRID_SHARD);
  spec.mutable_sharding()->set_hybrid_shard_group_size(2);
  auto cluster = Start(spec, root, GetParam());
  ASSERT_NE(cluster, nullptr);
  Train(*cluster->client, 2);
  ASSERT_TRUE(Save(*cluster->client, "sharded", v1::SHARDED_STATE_DICT).ok());
  ASSERT_TRUE(Save(*cluster->client, "full", v1::FULL_STATE_DICT).ok());
  const std::string out = absl::StrCat(root, "/", kJob, "/consolidated");
  absl::StatusOr<CheckpointManifest> written = ConsolidateCheckpoint(Dir(root, "sharded"), out);
  ASSERT_TRUE(written.ok()) << written.status();
  ExpectSameTensors(Dir(root, "full") + "/model.safetensors", out + "/model.safetensors");
  ExpectSameTensors(Dir(root, "full") + "/optim.safetensors", out + "/optim.safetensors");
  uint64_t total = 0, smallest = UINT64_MAX;
  for (int r = 0; r < 4; ++r) {
    absl::StatusOr<std::unique_ptr<SafetensorsReader>> file =
        SafetensorsReader::Open(Dir(root, "sharded") + "/" + RankFileName("model", r, 4));
    ASSERT_TRUE(file.ok()) << file.status();
    uint64_t elements = 0;
    for (const auto& [name, entry] : (*file)->header().tensors) elements += entry.numel();
    total += elements;
    smallest = std::min(smallest, elements);
  }
  EXPECT_GT(smallest, total / 8) << "a replica wrote less than half its shard's share";
  // The FULL files were written the same way: every rank its part, in place
  // (the manifest's parse checked that the parts tile each file).
  absl::StatusOr<std::unique_ptr<CheckpointReader>> full =
      CheckpointReader::Open(Dir(root, "full"));
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(WritersOf((*full)->manifest(), kFullModelFile), (std::set<int>{0, 1, 2, 3}));
  EXPECT_TRUE((*full)->VerifyAll().ok());
}

// NO_SHARD saves FULL (FSDP's rule): every rank holds every element, and each
// writes an even part of each unit, so the parts tile the files and a load
// at another strategy and world size gets what the job had.
TEST_P(CheckpointTest, NoShardFullSaveIsWrittenByEveryRankAndLoadsSharded) {
  const std::string root = testing::MakeTempDir("ckpt-no-shard") + "/checkpoints";
  v1::JobSpec spec = Spec(2, false);
  spec.mutable_sharding()->set_strategy(v1::NO_SHARD);
  {
    auto cluster = Start(spec, root, GetParam());
    ASSERT_NE(cluster, nullptr);
    Train(*cluster->client, 2);
    ASSERT_TRUE(Save(*cluster->client, "replicated", v1::FULL_STATE_DICT).ok());
  }
  absl::StatusOr<std::unique_ptr<CheckpointReader>> saved =
      CheckpointReader::Open(Dir(root, "replicated"));
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(WritersOf((*saved)->manifest(), kFullModelFile), (std::set<int>{0, 1}));
  ASSERT_TRUE((*saved)->VerifyAll().ok());
  // The offline verifier checks every region and says so.
  absl::StatusOr<VerifyRun> verify = RunVerify(Dir(root, "replicated"));
  ASSERT_TRUE(verify.ok()) << verify.status();
  const std::string& output = verify->output;
  EXPECT_EQ(verify->exit_code, 0) << output;
  EXPECT_THAT(output, HasSubstr("from 2 writers, each xxh3"));
  EXPECT_THAT(output, HasSubstr("verified: 2 files"));
  auto sharded = Start(Spec(3, false), root, GetParam());
  ASSERT_NE(sharded, nullptr);
  ASSERT_TRUE(sharded->client->LoadCheckpoint(kJob, "replicated").ok());
  ASSERT_TRUE(Save(*sharded->client, "resaved", v1::FULL_STATE_DICT).ok());
  ExpectSameTensors(Dir(root, "replicated") + "/model.safetensors",
                    Dir(root, "resaved") + "/model.safetensors");
  ExpectSameTensors(Dir(root, "replicated") + "/optim.safetensors",
                    Dir(root, "resaved") + "/optim.safetensors");
}

// A checkpoint of another model is refused before anything changes, naming
// the parameters that do not match.
TEST_P(CheckpointTest, CheckpointOfAnotherModelIsRefused) {
  const std::string root = testing::MakeTempDir("ckpt-model") + "/checkpoints";
  {
    auto cluster = Start(Spec(2, true), root, GetParam());
    ASSERT_NE(cluster, nullptr);
    ASSERT_TRUE(Save(*cluster->client, "mlp", v1::SHARDED_STATE_DICT).ok());
  }
  v1::JobSpec other = Spec(2, true);
  // The same model with its output layer renamed "head".
  for (v1::ModuleSpec& child : *other.mutable_model()->mutable_root()->mutable_children()) {
    if (child.name() == "output") child.set_name("head");
  }
  auto cluster = Start(other, root, GetParam());
  ASSERT_NE(cluster, nullptr);
  absl::StatusOr<v1::CheckpointProgress> load = cluster->client->LoadCheckpoint(kJob, "mlp");
  ASSERT_FALSE(load.ok());
  EXPECT_EQ(load.status().code(), absl::StatusCode::kFailedPrecondition) << load.status();
  EXPECT_THAT(std::string(load.status().message()), HasSubstr("does not fit this model"));
  EXPECT_THAT(std::string(load.status().message()), HasSubstr("missing head.weight, head.bias"));
  EXPECT_THAT(std::string(load.status().message()),
              HasSubstr("unexpected output.bias, output.weight"));
  EXPECT_EQ(Train(*cluster->client, 1).at(0).step(), 1);  // unchanged, still trains
}

// Issue #5: train 10, checkpoint, train 10 more; a fresh cluster that loads
// the checkpoint and trains 10 gives identical losses (fp32). The checkpoint
// is async and the 10 more steps start as soon as its snapshot is taken, so
// this also shows the snapshot is the state at step 10, untouched by the
// training that ran while it was written.
TEST_P(CheckpointTest, ResumeContinuesTrainingExactly) {
  const std::string root = testing::MakeTempDir("ckpt-resume") + "/checkpoints";
  std::vector<v1::StepResult> expected;
  {
    auto first = Start(Spec(4, true), root, GetParam());
    ASSERT_NE(first, nullptr);
    Train(*first->client, 10);
    std::promise<void> snapshot_taken;
    bool released = false;
    std::thread trainer([&] {
      snapshot_taken.get_future().wait();
      FlatshardClient other(first->processes->address());
      expected = Train(other, 10);
    });
    v1::SaveCheckpointRequest request;
    request.set_job(kJob);  // unnamed: step-00000010
    request.set_async_save(true);
    request.mutable_settings()->set_state_dict_type(v1::SHARDED_STATE_DICT);
    absl::StatusOr<v1::CheckpointProgress> saved =
        first->client->SaveCheckpoint(request, [&](const v1::CheckpointProgress& p) {
          if (!p.done() && !released) {
            released = true;
            snapshot_taken.set_value();
          }
        });
    if (!released) snapshot_taken.set_value();  // the save failed: let the trainer finish
    trainer.join();
    ASSERT_TRUE(saved.ok()) << saved.status();
    ASSERT_EQ(expected.size(), 10u);
  }
  auto second = Start(Spec(4, true), root, GetParam());
  ASSERT_NE(second, nullptr);
  absl::StatusOr<v1::CheckpointProgress> loaded = second->client->LoadCheckpoint(kJob, "latest");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->name(), "step-00000010");
  const std::vector<v1::StepResult> resumed = Train(*second->client, 10);
  ASSERT_EQ(resumed.size(), expected.size());
  for (size_t i = 0; i < resumed.size(); ++i) {
    EXPECT_EQ(resumed[i].step(), expected[i].step());
    EXPECT_EQ(resumed[i].loss(), expected[i].loss()) << "step " << resumed[i].step();
    EXPECT_EQ(
        std::vector<double>(resumed[i].rank_losses().begin(), resumed[i].rank_losses().end()),
        std::vector<double>(expected[i].rank_losses().begin(), expected[i].rank_losses().end()));
  }
}

void FlipByte(const std::string& path, int64_t from_end) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-from_end, std::ios::end);
  char c = 0;
  f.read(&c, 1);
  f.seekp(-from_end, std::ios::end);
  c = static_cast<char>(c ^ 0x40);
  f.write(&c, 1);
}

TEST_P(CheckpointTest, DamagedCheckpointsAreRefusedNamingTheFileAndChangeNothing) {
  const std::string root = testing::MakeTempDir("ckpt-damage") + "/checkpoints";
  auto cluster = Start(Spec(2, true), root, GetParam());
  ASSERT_NE(cluster, nullptr);
  FlatshardClient& client = *cluster->client;
  Train(client, 2);
  for (const char* name : {"flipped", "truncated", "lying", "incomplete"}) {
    ASSERT_TRUE(Save(client, name, v1::SHARDED_STATE_DICT).ok());
  }
  const std::string flipped = Dir(root, "flipped") + "/model-rank00001-of-00002.safetensors";
  FlipByte(flipped, 100);
  const std::string truncated = Dir(root, "truncated") + "/optim-rank00000-of-00002.safetensors";
  fs::resize_file(truncated, fs::file_size(truncated) - 10);
  {  // a manifest whose checksum does not match an intact file
    const std::string manifest = Dir(root, "lying") + "/manifest.json";
    std::string text = *ReadFileToString(manifest);
    const size_t at = text.find("\"xxh3\": \"") + 9;
    text[at] = text[at] == '0' ? '1' : '0';
    ASSERT_TRUE(WriteFileDurably(manifest, text).ok());
  }
  {  // a manifest that leaves a rank's file out (it would read as zero state)
    const std::string manifest = Dir(root, "incomplete") + "/manifest.json";
    nlohmann::json json = nlohmann::json::parse(*ReadFileToString(manifest));
    nlohmann::json kept = nlohmann::json::array();
    for (const auto& f : json["files"]) {
      if (f["name"] != "optim-rank00001-of-00002.safetensors") kept.push_back(f);
    }
    json["files"] = kept;
    ASSERT_TRUE(WriteFileDurably(manifest, json.dump(2)).ok());
  }
  const std::vector<v1::StepResult> before = Train(client, 1);
  for (const auto& [name, file] : std::vector<std::pair<std::string, std::string>>{
           {"flipped", flipped},
           {"truncated", truncated},
           {"lying", "model-rank00000-of-00002.safetensors"},
           {"incomplete", "optim-rank00001-of-00002.safetensors"}}) {
    absl::StatusOr<v1::CheckpointProgress> load = client.LoadCheckpoint(kJob, name);
    ASSERT_FALSE(load.ok()) << name;
    EXPECT_EQ(load.status().code(), absl::StatusCode::kDataLoss) << load.status();
    EXPECT_THAT(std::string(load.status().message()), HasSubstr(fs::path(file).filename().string()))
        << name;
    EXPECT_THAT(std::string(load.status().message()), HasSubstr("the job is unchanged"));
  }
  // Nothing was applied: the job trains on from where it was.
  const std::vector<v1::StepResult> after = Train(client, 1);
  EXPECT_EQ(after.at(0).step(), before.at(0).step() + 1);
  // The offline verifier agrees and names the file.
  absl::StatusOr<VerifyRun> verify = RunVerify(Dir(root, "flipped"));
  ASSERT_TRUE(verify.ok()) << verify.status();
  const std::string& output = verify->output;
  EXPECT_EQ(verify->exit_code, 1) << output;
  EXPECT_THAT(output, HasSubstr("BAD   model-rank00001-of-00002.safetensors"));
  EXPECT_THAT(output, HasSubstr("ok    model-rank00000-of-00002.safetensors"));
}

// A scheduled save at a step whose name another history took (the job
// loaded an older checkpoint and trained back to that step) saves this
// state under the next suffix rather than skip it; one that is this state
// already is not saved again.
TEST_P(CheckpointTest, AScheduledSaveAtAStepAnotherHistoryTookSavesUnderANewName) {
  const std::string root = testing::MakeTempDir("ckpt-history") + "/checkpoints";
  v1::JobSpec spec = Spec(2, true);
  spec.mutable_checkpoints()->set_every_steps(2);
  auto cluster = Start(spec, root, GetParam());
  ASSERT_NE(cluster, nullptr);
  FlatshardClient& client = *cluster->client;
  Train(client, 4);  // scheduled: step-00000002, step-00000004
  ASSERT_TRUE(client.LoadCheckpoint(kJob, "step-00000002").ok());
  Train(client, 2);  // step 4 again, another state
  absl::StatusOr<v1::Job> job = client.GetJob(kJob);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->step(), 4);
  EXPECT_EQ(job->state_checkpoint(), "step-00000004-2");
  absl::StatusOr<std::vector<v1::CheckpointInfo>> all = client.ListCheckpoints(kJob);
  ASSERT_TRUE(all.ok()) << all.status();
  std::vector<std::string> names;
  for (const auto& info : *all) names.push_back(info.name());
  EXPECT_EQ(names, (std::vector<std::string>{"step-00000002", "step-00000004", "step-00000004-2"}))
      << absl::StrJoin(names, ",");
}

// A second client checkpoints while the first streams Train; scheduled
// checkpoints and retention come from the job spec.
TEST_P(CheckpointTest, CheckpointsDuringTrainingOnDemandAndOnSchedule) {
  const std::string root = testing::MakeTempDir("ckpt-during") + "/checkpoints";
  v1::JobSpec spec = Spec(2, true);
  spec.mutable_checkpoints()->set_every_steps(4);
  spec.mutable_checkpoints()->set_keep_last(2);
  spec.mutable_checkpoints()->mutable_settings()->set_state_dict_type(v1::LOCAL_STATE_DICT);
  auto cluster = Start(spec, root, GetParam());
  ASSERT_NE(cluster, nullptr);
  std::promise<void> first_step;
  std::vector<v1::StepResult> steps;
  std::thread trainer([&] {
    absl::Status status = cluster->client->Train(kJob, 12, 0, [&](const v1::StepResult& r) {
      steps.push_back(r);
      if (r.step() == 1) first_step.set_value();
    });
    EXPECT_TRUE(status.ok()) << status;
  });
  first_step.get_future().wait();
  FlatshardClient second(cluster->processes->address());
  absl::StatusOr<v1::CheckpointProgress> during = Save(second, "during", v1::FULL_STATE_DICT);
  int async_messages = 0;
  absl::StatusOr<v1::CheckpointProgress> async_during =
      Save(second, "async-during", v1::SHARDED_STATE_DICT, /*async_save=*/true, &async_messages);
  trainer.join();
  ASSERT_TRUE(during.ok()) << during.status();
  ASSERT_TRUE(async_during.ok()) << async_during.status();
  EXPECT_EQ(async_messages, 2);  // the snapshot, then the commit
  EXPECT_TRUE(async_during->done());
  absl::StatusOr<std::unique_ptr<CheckpointReader>> async_saved =
      CheckpointReader::Open(Dir(root, "async-during"));
  ASSERT_TRUE(async_saved.ok()) << async_saved.status();
  EXPECT_TRUE((*async_saved)->VerifyAll().ok());
  ASSERT_EQ(steps.size(), 12u);
  for (size_t i = 0; i < steps.size(); ++i) EXPECT_EQ(steps[i].step(), static_cast<int64_t>(i + 1));
  absl::StatusOr<std::unique_ptr<CheckpointReader>> saved =
      CheckpointReader::Open(Dir(root, "during"));
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_GE((*saved)->manifest().step, 1);
  EXPECT_LE((*saved)->manifest().step, 12);
  EXPECT_TRUE((*saved)->VerifyAll().ok());
  // Scheduled at steps 4, 8 and 12, keep_last 2: step 4 was retired; "during"
  // was asked for by a user, and retention never deletes those.
  absl::StatusOr<std::vector<v1::CheckpointInfo>> all = cluster->client->ListCheckpoints(kJob);
  ASSERT_TRUE(all.ok()) << all.status();
  std::vector<std::string> names;
  for (const auto& info : *all) names.push_back(info.name());
  std::sort(names.begin(), names.end());  // "during" may land anywhere in time
  ASSERT_EQ(names,
            (std::vector<std::string>{"async-during", "during", "step-00000008", "step-00000012"}))
      << absl::StrJoin(names, ",");
  for (const auto& info : *all) {
    EXPECT_EQ(info.latest(), info.name() == "step-00000012") << info.name();
    EXPECT_EQ(info.state_dict_type(), info.name() == "during"         ? v1::FULL_STATE_DICT
                                      : info.name() == "async-during" ? v1::SHARDED_STATE_DICT
                                                                      : v1::LOCAL_STATE_DICT);
  }
  EXPECT_FALSE(fs::exists(Dir(root, "step-00000004")));
  // Bad requests: names that escape the root, unknown checkpoints.
  EXPECT_EQ(Save(second, "../escape", v1::FULL_STATE_DICT).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<v1::CheckpointProgress> missing = second.LoadCheckpoint(kJob, "nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("step-00000012"));
  EXPECT_EQ(second.DeleteCheckpoint(kJob, "nope").code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(second.DeleteCheckpoint(kJob, "step-00000012").ok());
  EXPECT_NE(*ReadFileToString(absl::StrCat(root, "/", kJob, "/latest")), "step-00000012\n");
}

std::string DeviceTestName(const ::testing::TestParamInfo<std::string>& p) {
  if (p.param == "sim") return "SimDevice";
  return p.param == "cuda" ? "CudaDevice" : "Cpu";
}

INSTANTIATE_TEST_SUITE_P(Devices, CheckpointTest, ::testing::Values("cpu", "sim"), DeviceTestName);
#if defined(FLATSHARD_TEST_CUDA_WORKERS)
INSTANTIATE_TEST_SUITE_P(Gpu, CheckpointTest, ::testing::Values("cuda"), DeviceTestName);
#endif

}  // namespace
}  // namespace flatshard
