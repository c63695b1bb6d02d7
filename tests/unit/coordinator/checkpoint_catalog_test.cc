// CheckpointCatalog housekeeping on real files: what a crashed save left
// (<name>.partial/) is removed at job creation, committed checkpoints and
// anything else in the job directory are not.
#include "coordinator/checkpoint_catalog.h"

#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace flatshard {
namespace {

namespace fs = std::filesystem;

TEST(CheckpointCatalogTest, RemovesStalePartialsOnly) {
  const fs::path root = fs::path(::testing::TempDir()) / "catalog-partials";
  fs::remove_all(root);
  const fs::path job = root / "j";
  fs::create_directories(job / "step-00000003.partial" / "sub");
  std::ofstream(job / "step-00000003.partial" / "model-rank00000-of-00002.safetensors") << "x";
  fs::create_directories(job / "ondemand.partial");
  fs::create_directories(job / "step-00000001");  // committed
  std::ofstream(job / "notes.partial") << "a file, not a save";
  CheckpointCatalog catalog(root.string(), "j");
  EXPECT_THAT(catalog.RemoveStalePartials(),
              ::testing::UnorderedElementsAre("step-00000003", "ondemand"));
  EXPECT_FALSE(fs::exists(job / "step-00000003.partial"));
  EXPECT_FALSE(fs::exists(job / "ondemand.partial"));
  EXPECT_TRUE(fs::exists(job / "step-00000001"));
  EXPECT_TRUE(fs::exists(job / "notes.partial"));
  EXPECT_TRUE(catalog.RemoveStalePartials().empty());
  // A job directory that does not exist yet has nothing to remove.
  CheckpointCatalog fresh(root.string(), "new-job");
  EXPECT_TRUE(fresh.RemoveStalePartials().empty());
}

}  // namespace
}  // namespace flatshard
