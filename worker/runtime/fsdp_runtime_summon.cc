// FsdpRuntime's summon_full_params (docs/fsdp-semantics.md §5.5): every
// parameter gathered whole, unit by unit, outside a step.
#include <algorithm>

#include "absl/strings/str_cat.h"

#include "core/status_macros.h"
#include "worker/runtime/fsdp_runtime.h"

namespace flatshard {

absl::Status FsdpRuntime::SummonFullParams(
    const SummonOptions& options, const std::function<absl::Status(SummonedParams&)>& body) {
  if (options.with_grads && (!options_.sharding.use_orig_params || options.offload_to_cpu)) {
    return absl::UnimplementedError(
        "summon_full_params: with_grads needs use_orig_params=True and offload_to_cpu=False");
  }
  if (options.offload_to_cpu && !IsSharded(strategy_)) {
    return absl::UnimplementedError(
        "summon_full_params: offload_to_cpu is not supported with NO_SHARD");
  }
  if (options.writeback && options.rank0_only) {
    return absl::UnimplementedError(
        "summon_full_params: writeback with rank0_only is not supported");
  }
  if (program_ != nullptr) {
    return absl::FailedPreconditionError(
        "summon_full_params: cannot manually unshard parameters during forward/backward");
  }
  RETURN_IF_ERROR(device_->MakeCurrent());
  // Summon reads and writes the shards through host copies (pinned staging) and
  // gathers over the host group: the streams must be idle first.
  RETURN_IF_ERROR(SynchronizeStreams());
  SummonedParams summoned;
  std::vector<std::vector<float>> flats(units_.size());
  for (size_t u = 0; u < units_.size(); ++u) {
    FlatParamUnit& unit = *units_[u];
    RETURN_IF_ERROR(unit.GatherFullPrecision(flats[u]));
    std::vector<float> grad_flat;
    if (options.with_grads) RETURN_IF_ERROR(unit.GatherGradFullPrecision(grad_flat));
    if (options.rank0_only && rank_ != 0) continue;
    const Unit& spec = unit.config().unit;
    for (size_t i = 0; i < spec.params.size(); ++i) {
      const FlatRange& range = unit.layout().param_ranges()[i];
      summoned.params[spec.params[i].fqn].assign(flats[u].begin() + range.start,
                                                 flats[u].begin() + range.end + 1);
      if (!grad_flat.empty()) {
        summoned.grads[spec.params[i].fqn].assign(grad_flat.begin() + range.start,
                                                  grad_flat.begin() + range.end + 1);
      }
    }
    for (const SharedParam& shared : spec.shared) {
      summoned.params[shared.fqn] = summoned.params[shared.primary_fqn];
    }
  }
  RETURN_IF_ERROR(body(summoned));
  if (!options.writeback) return absl::OkStatus();
  for (size_t u = 0; u < units_.size(); ++u) {
    FlatParamUnit& unit = *units_[u];
    const Unit& spec = unit.config().unit;
    for (size_t i = 0; i < spec.params.size(); ++i) {
      const std::vector<float>& values = summoned.params[spec.params[i].fqn];
      const FlatRange& range = unit.layout().param_ranges()[i];
      if (values.size() != static_cast<size_t>(range.numel())) {
        return absl::InvalidArgumentError(
            absl::StrCat("summon_full_params: cannot writeback when the parameter shape changes ('",
                         spec.params[i].fqn, "' has ", values.size(), " elements, expected ",
                         range.numel(), ")"));
      }
      std::copy(values.begin(), values.end(), flats[u].begin() + range.start);
    }
    RETURN_IF_ERROR(unit.WriteBackFull(flats[u]));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, std::vector<float>>> FsdpRuntime::SummonFullParams() {
  RETURN_IF_ERROR(device_->MakeCurrent());
  RETURN_IF_ERROR(SynchronizeStreams());
  std::map<std::string, std::vector<float>> out;
  for (auto& unit : units_) {
    std::vector<float> flat;
    RETURN_IF_ERROR(unit->GatherFullPrecision(flat));
    const Unit& spec = unit->config().unit;
    for (size_t i = 0; i < spec.params.size(); ++i) {
      const FlatRange& range = unit->layout().param_ranges()[i];
      out[spec.params[i].fqn].assign(flat.begin() + range.start, flat.begin() + range.end + 1);
    }
    for (const SharedParam& shared : spec.shared) out[shared.fqn] = out[shared.primary_fqn];
  }
  return out;
}

}  // namespace flatshard
