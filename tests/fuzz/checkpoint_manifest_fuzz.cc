// Fuzz target for checkpoint manifests (storage/checkpoint_manifest.h): the
// coordinator's catalog and the offline tools read manifest.json from a
// checkpoint directory, which is only as trusted as the disk under it.
//
// Asserts: an accepted manifest is a fixed point of ManifestToJson (writing it
// and reading it back gives the same manifest, so `ckpt` tools that rewrite a
// manifest lose nothing), its file names are plain names the catalog may join
// to a directory, and the job spec it embeds, when the coordinator would
// accept it, is self-consistent (job_checks.h): consolidate and reshard
// recompute units and layouts from it. Seeds (corpus/checkpoint_manifest):
// FULL and SHARDED manifests of the sample job and a minimal one, written by
// ManifestToJson (`--write-seeds`).
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

#include "core/job_config.h"
#include "core/model_spec.h"
#include "storage/checkpoint_manifest.h"
#include "tests/fuzz/fuzz_driver.h"
#include "tests/fuzz/job_checks.h"

namespace flatshard::fuzz {
namespace {

CheckpointManifest SampleManifest(v1::StateDictType type) {
  CheckpointManifest m;
  m.job_spec = SampleJobSpec();
  const absl::StatusOr<JobConfig> config = JobConfigFromProto(m.job_spec);
  FUZZ_CHECK(config.ok(), config.status().ToString());
  absl::StatusOr<ModelIndex> index = IndexModel(config->model);
  FUZZ_CHECK(index.ok(), index.status().ToString());
  for (const IndexedParam& param : index->params) {
    m.params[param.fqn] = {param.spec->dtype, param.spec->shape};
  }
  m.name = type == v1::FULL_STATE_DICT ? "step-40" : "nightly.2";
  m.job = m.job_spec.name();
  m.job_spec_digest = JobSpecDigest(m.job_spec);
  m.step = 40;
  m.state_dict_type = type;
  m.world_size = m.job_spec.world_size();
  m.strategy = "FULL_SHARD";
  m.optimizer = "adamw";
  m.optimizer_states = {"exp_avg", "exp_avg_sq"};
  m.data_seed = 1;
  m.data_position = 40;
  m.global_batch_size = 32;
  m.init_seed = 0;
  m.created_unix_micros = 1700000000000000;
  if (type == v1::FULL_STATE_DICT) {
    // Every rank writes part of each FULL file (format version 3).
    m.files = {{std::string(kFullModelFile),
                0,
                4356,
                "",
                {{0, 2000, "0123456789abcdef"}, {3000, 1356, "0123456789abcd00"}}},
               {std::string(kFullModelFile), 1, 4356, "", {{2000, 1000, "0123456789abcdee"}}},
               {std::string(kFullOptimFile), 0, 8712, "fedcba9876543210", {}}};
  } else {
    m.scheduled = true;
    for (int rank = 0; rank < m.world_size; ++rank) {
      m.files.push_back(
          {RankFileName("model", rank, m.world_size), rank, 1100, "00000000000000aa", {}});
      m.files.push_back(
          {RankFileName("optim", rank, m.world_size), rank, 2200, "00000000000000bb", {}});
    }
  }
  return m;
}

}  // namespace

bool FuzzOneInput(absl::string_view input) {
  absl::StatusOr<CheckpointManifest> parsed = ParseManifest(input, "manifest.json");
  if (!parsed.ok()) return false;
  FUZZ_CHECK(parsed->world_size > 0 && parsed->step >= 0, "accepted a negative step or world");
  for (const CheckpointFile& file : parsed->files) {
    FUZZ_CHECK(
        !file.name.empty() && file.name.find('/') == std::string::npos && file.name.front() != '.',
        absl::StrCat("accepted the file name '", file.name, "'"));
  }
  const std::string written = ManifestToJson(*parsed);
  absl::StatusOr<CheckpointManifest> reread = ParseManifest(written, "rewritten manifest.json");
  FUZZ_CHECK(reread.ok(), absl::StrCat(reread.status().ToString(), " in\n", written));
  // The embedded spec by value: its JSON reads -0.0 back as 0.
  CheckEquivalent(parsed->job_spec, reread->job_spec, "in a rewritten manifest");
  CheckpointManifest before = *parsed;
  before.job_spec.Clear();
  reread->job_spec.Clear();
  FUZZ_CHECK(ManifestToJson(*reread) == ManifestToJson(before),
             absl::StrCat("the manifest changed when written and read back:\n", written));
  absl::StatusOr<JobConfig> config = JobConfigFromProto(parsed->job_spec);
  if (config.ok()) CheckAcceptedJob(parsed->job_spec, *config);
  return true;
}

std::vector<Seed> GeneratedSeeds(const std::vector<Seed>& /*corpus*/) {
  CheckpointManifest minimal;  // no tensors, no files, an empty job spec
  minimal.name = "empty";
  minimal.world_size = 1;
  CheckpointManifest copy = SampleManifest(v1::FULL_STATE_DICT);  // ckpt consolidate's
  copy.name = "full-copy";
  copy.converted_from = "full";
  return {{"full.json", ManifestToJson(SampleManifest(v1::FULL_STATE_DICT))},
          {"sharded.json", ManifestToJson(SampleManifest(v1::SHARDED_STATE_DICT))},
          {"copy.json", ManifestToJson(copy)},
          {"minimal.json", ManifestToJson(minimal)}};
}

}  // namespace flatshard::fuzz
