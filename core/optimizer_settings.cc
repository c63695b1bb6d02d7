// The job-level view of the optimizer (OptimizerKind, OptimizerSettings; see
// core/optimizer.h): names, validation, the state a kind keeps, and one step
// dispatched by kind, so the runtime, the plan and checkpoints need no switch
// of their own.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

#include "core/optimizer.h"

namespace flatshard {

absl::string_view OptimizerKindName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kAdam:
      return "adam";
    case OptimizerKind::kAdamW:
      return "adamw";
  }
  return "unknown";
}

absl::StatusOr<OptimizerKind> ParseOptimizerKind(absl::string_view name) {
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdam, OptimizerKind::kAdamW}) {
    if (name == OptimizerKindName(kind)) return kind;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown optimizer '", name, "'; expected sgd, adam or adamw"));
}

absl::Status ValidateOptimizerSettings(const OptimizerSettings& settings) {
  if (settings.kind == OptimizerKind::kSgd) return ValidateSgdOptions(settings.sgd);
  return ValidateAdamOptions(settings.adam);
}

std::vector<std::string> OptimizerStateNames(const OptimizerSettings& settings) {
  if (settings.kind == OptimizerKind::kSgd) {
    if (settings.sgd.momentum == 0.0) return {};
    return {std::string(SgdState::kMomentumBuffer)};
  }
  std::vector<std::string> names = {std::string(AdamState::kExpAvg),
                                    std::string(AdamState::kExpAvgSq)};
  if (settings.adam.amsgrad) names.emplace_back(AdamState::kMaxExpAvgSq);
  return names;
}

int OptimizerStatesPerElement(const OptimizerSettings& settings) {
  return static_cast<int>(OptimizerStateNames(settings).size());
}

std::unique_ptr<OptimizerState> MakeOptimizerState(OptimizerKind kind, size_t size) {
  if (kind == OptimizerKind::kSgd) return std::make_unique<SgdState>(size);
  return std::make_unique<AdamState>(size);
}

}  // namespace flatshard
