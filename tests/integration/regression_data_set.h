// A small FILE data set for examples/mlp.yaml, for tests where a node has a
// data set or lost it (docs/job-spec.md, "Text data for language models"
// describes the layout; `data.kind: file` reads it under each worker's
// --data-dir).
#ifndef FLATSHARD_TESTS_INTEGRATION_REGRESSION_DATA_SET_H_
#define FLATSHARD_TESTS_INTEGRATION_REGRESSION_DATA_SET_H_

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "worker/compute/npy.h"

namespace flatshard::testing {

// 64 samples of 64 inputs and 16 targets in <dir>/set/{inputs,targets}.npy:
// a job trains on it with data {kind: file, path: set}.
inline void WriteRegressionDataSet(const std::string& dir) {
  std::filesystem::create_directories(dir + "/set");
  constexpr int64_t kSamples = 64;
  std::vector<float> inputs(kSamples * 64);
  std::vector<float> targets(kSamples * 16);
  for (size_t i = 0; i < inputs.size(); ++i) inputs[i] = static_cast<float>(i % 7) * 0.1F - 0.3F;
  for (size_t i = 0; i < targets.size(); ++i) targets[i] = static_cast<float>(i % 5) * 0.2F;
  ASSERT_TRUE(compute::WriteNpyFile(dir + "/set/inputs.npy", DType::kFloat32, {kSamples, 64},
                                    std::as_bytes(std::span(inputs)))
                  .ok());
  ASSERT_TRUE(compute::WriteNpyFile(dir + "/set/targets.npy", DType::kFloat32, {kSamples, 16},
                                    std::as_bytes(std::span(targets)))
                  .ok());
}

}  // namespace flatshard::testing

#endif  // FLATSHARD_TESTS_INTEGRATION_REGRESSION_DATA_SET_H_
