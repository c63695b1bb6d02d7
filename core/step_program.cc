#include "core/step_program.h"

#include <map>
#include <set>

#include <xxhash.h>

#include "absl/strings/str_cat.h"

namespace flatshard {
namespace {

class Compiler {
 public:
  Compiler(const ModelIndex& index, const std::vector<Unit>& units,
           const StepProgramOptions& options)
      : index_(index), units_(units), options_(options) {
    for (const Unit& unit : units_) unit_of_module_[unit.module_index] = unit.index;
    // Pre- and post-forward orders (reference §9.2's _ExecOrderData) come from
    // the same walk the model's hooks follow.
    RecordOrders(0);
  }

  std::vector<v1::Command> Compile() {
    Forward(0);
    Backward(0);
    if (options_.sync_gradients) {
      if (options_.max_grad_norm > 0) {
        auto* clip = Add().mutable_clip_grad_norm();
        clip->set_max_norm(options_.max_grad_norm);
        clip->set_norm_type(options_.grad_norm_type);
      }
      Add().mutable_optim_step();
    }
    return std::move(program_);
  }

 private:
  bool sharded() const { return IsSharded(options_.strategy); }
  const Unit* UnitAt(int module) const {
    auto it = unit_of_module_.find(module);
    return it == unit_of_module_.end() ? nullptr : &units_[static_cast<size_t>(it->second)];
  }
  v1::Command& Add() { return program_.emplace_back(); }
  void Unshard(int unit, bool prefetch) {
    auto* op = Add().mutable_unshard();
    op->set_unit(unit);
    op->set_prefetch(prefetch);
  }

  void RecordOrders(int module) {
    const Unit* unit = UnitAt(module);
    if (unit != nullptr) pre_forward_.push_back(unit->index);
    for (int child : index_.modules[static_cast<size_t>(module)].children) RecordOrders(child);
    if (unit != nullptr) post_forward_.push_back(unit->index);
  }

  int Neighbour(const std::vector<int>& order, int unit, int delta) const {
    for (size_t i = 0; i < order.size(); ++i) {
      if (order[i] != unit) continue;
      const int64_t j = static_cast<int64_t>(i) + delta;
      if (j < 0 || j >= static_cast<int64_t>(order.size())) return -1;
      return order[static_cast<size_t>(j)];
    }
    return -1;
  }

  void Forward(int module) {
    const Unit* unit = UnitAt(module);
    if (unit != nullptr) {
      auto* marker = Add().mutable_forward();
      marker->set_module(module);
      if (sharded()) {
        Unshard(unit->index, false);
        const int next = Neighbour(pre_forward_, unit->index, +1);
        if (options_.forward_prefetch && next >= 0) Unshard(next, true);
      }
    }
    for (int child : index_.modules[static_cast<size_t>(module)].children) Forward(child);
    if (unit != nullptr) {
      auto* marker = Add().mutable_forward();
      marker->set_module(module);
      marker->set_done(true);
      if (sharded() && ReshardAfterForward(options_.strategy, unit->is_root)) {
        Add().mutable_reshard()->set_unit(unit->index);
      }
    }
  }

  void Backward(int module) {
    const Unit* unit = UnitAt(module);
    // Backward's target is the unit before this one in post-forward order, if its
    // own backward has not begun (_needs_pre_backward_unshard, reference §9.2).
    const int target = unit != nullptr ? Neighbour(post_forward_, unit->index, -1) : -1;
    if (unit != nullptr) {
      backward_started_.insert(unit->index);
      auto* marker = Add().mutable_backward();
      marker->set_module(module);
      if (sharded()) {
        Unshard(unit->index, false);
        if (options_.backward_prefetch == BackwardPrefetch::kPre && target >= 0 &&
            !backward_started_.contains(target)) {
          Unshard(target, true);
        }
      }
    }
    const auto& children = index_.modules[static_cast<size_t>(module)].children;
    for (auto it = children.rbegin(); it != children.rend(); ++it) Backward(*it);
    if (unit != nullptr) {
      auto* marker = Add().mutable_backward();
      marker->set_module(module);
      marker->set_done(true);
      if (options_.sync_gradients) Add().mutable_reduce_grad()->set_unit(unit->index);
      if (sharded() && FreeAfterBackward(options_.strategy, options_.sync_gradients)) {
        Add().mutable_reshard()->set_unit(unit->index);
      }
      if (sharded() && options_.backward_prefetch == BackwardPrefetch::kPost && target >= 0 &&
          !backward_started_.contains(target)) {
        Unshard(target, true);
      }
    }
  }

  const ModelIndex& index_;
  const std::vector<Unit>& units_;
  const StepProgramOptions& options_;
  std::map<int, int> unit_of_module_;
  std::vector<int> pre_forward_;
  std::vector<int> post_forward_;
  std::set<int> backward_started_;
  std::vector<v1::Command> program_;
};

}  // namespace

std::vector<v1::Command> CompileStepProgram(const ModelIndex& index, const std::vector<Unit>& units,
                                            const StepProgramOptions& options) {
  return Compiler(index, units, options).Compile();
}

std::string ProgramDigest(const std::vector<v1::Command>& commands, int64_t step,
                          bool sync_gradients) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_128bits_reset(state);
  XXH3_128bits_update(state, &step, sizeof(step));
  const char sync = sync_gradients ? 1 : 0;
  XXH3_128bits_update(state, &sync, 1);
  for (const v1::Command& command : commands) {
    // Commands hold no maps, so their serialization is deterministic.
    const std::string bytes = command.SerializeAsString();
    const uint64_t size = bytes.size();
    XXH3_128bits_update(state, &size, sizeof(size));
    XXH3_128bits_update(state, bytes.data(), bytes.size());
  }
  const XXH128_hash_t hash = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, hash);
  return std::string(reinterpret_cast<const char*>(canonical.digest), sizeof(canonical.digest));
}

std::string DescribeCommand(const v1::Command& c) {
  switch (c.op_case()) {
    case v1::Command::kForward:
      return absl::StrCat("Forward", c.forward().done() ? "Done(" : "(", c.forward().module(), ")");
    case v1::Command::kBackward:
      return absl::StrCat("Backward", c.backward().done() ? "Done(" : "(", c.backward().module(),
                          ")");
    case v1::Command::kUnshard:
      return absl::StrCat(c.unshard().prefetch() ? "Prefetch(" : "Unshard(", c.unshard().unit(),
                          ")");
    case v1::Command::kReshard:
      return absl::StrCat("Reshard(", c.reshard().unit(), ")");
    case v1::Command::kReduceGrad:
      return absl::StrCat("ReduceGrad(", c.reduce_grad().unit(), ")");
    case v1::Command::kClipGradNorm:
      return absl::StrCat("ClipGradNorm(", c.clip_grad_norm().max_norm(), ")");
    case v1::Command::kOptimStep:
      return "OptimStep";
    case v1::Command::kZeroGrad:
      return "ZeroGrad";
    default:
      return absl::StrCat("Command(", static_cast<int>(c.op_case()), ")");
  }
}

}  // namespace flatshard
