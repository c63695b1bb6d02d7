#include "core/step_program.h"

#include <map>
#include <set>

#include <xxhash.h>

#include "absl/base/casts.h"
#include "absl/strings/str_cat.h"

namespace flatshard {
namespace {

class Compiler {
 public:
  Compiler(const ModelIndex& index, const std::vector<Unit>& units,
           const StepProgramOptions& options)
      : index_(index), units_(units), options_(options) {
    for (const Unit& unit : units_) unit_of_module_[unit.module_index] = unit.index;
    // Pre- and post-forward orders (docs/fsdp-semantics.md §9.2's _ExecOrderData) come from
    // the same walk the model's hooks follow.
    RecordOrders(0);
  }

  StepProgram Compile() {
    Forward(0);
    Backward(0);
    if (options_.sync_gradients) {
      if (options_.max_grad_norm > 0) {
        Add(StepCommand::ClipGradNorm(options_.max_grad_norm, options_.grad_norm_type));
      }
      Add(StepCommand::OptimStep());
    }
    return std::move(program_);
  }

 private:
  bool sharded() const { return IsSharded(options_.strategy); }
  const Unit* UnitAt(int module) const {
    auto it = unit_of_module_.find(module);
    return it == unit_of_module_.end() ? nullptr : &units_[static_cast<size_t>(it->second)];
  }
  void Add(const StepCommand& command) { program_.push_back(command); }

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
      Add(StepCommand::Forward(module, /*done=*/false));
      if (sharded()) {
        Add(StepCommand::Unshard(unit->index, /*prefetch=*/false));
        const int next = Neighbour(pre_forward_, unit->index, +1);
        if (options_.forward_prefetch && next >= 0) Add(StepCommand::Unshard(next, true));
      }
    }
    for (int child : index_.modules[static_cast<size_t>(module)].children) Forward(child);
    if (unit != nullptr) {
      Add(StepCommand::Forward(module, /*done=*/true));
      if (sharded() && ReshardAfterForward(options_.strategy, unit->is_root)) {
        Add(StepCommand::Reshard(unit->index));
      }
    }
  }

  void Backward(int module) {
    const Unit* unit = UnitAt(module);
    // Backward's target is the unit before this one in post-forward order, if its
    // own backward has not begun (_needs_pre_backward_unshard, docs/fsdp-semantics.md §9.2).
    const int target = unit != nullptr ? Neighbour(post_forward_, unit->index, -1) : -1;
    if (unit != nullptr) {
      backward_started_.insert(unit->index);
      Add(StepCommand::Backward(module, /*done=*/false));
      if (sharded()) {
        Add(StepCommand::Unshard(unit->index, /*prefetch=*/false));
        if (options_.backward_prefetch == BackwardPrefetch::kPre && target >= 0 &&
            !backward_started_.contains(target)) {
          Add(StepCommand::Unshard(target, /*prefetch=*/true));
        }
      }
    }
    const auto& children = index_.modules[static_cast<size_t>(module)].children;
    for (auto it = children.rbegin(); it != children.rend(); ++it) Backward(*it);
    if (unit != nullptr) {
      Add(StepCommand::Backward(module, /*done=*/true));
      if (options_.sync_gradients) Add(StepCommand::ReduceGrad(unit->index));
      if (sharded() && FreeAfterBackward(options_.strategy, options_.sync_gradients)) {
        Add(StepCommand::Reshard(unit->index));
      }
      if (sharded() && options_.backward_prefetch == BackwardPrefetch::kPost && target >= 0 &&
          !backward_started_.contains(target)) {
        Add(StepCommand::Unshard(target, /*prefetch=*/true));
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
  StepProgram program_;
};

// Little-endian, whatever the host: the digest must not depend on it.
void AppendLittleEndian(uint64_t value, int bytes, std::string& out) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

void AppendDouble(double value, std::string& out) {
  AppendLittleEndian(absl::bit_cast<uint64_t>(value), 8, out);
}

}  // namespace

StepCommand StepCommand::Forward(int module, bool done) {
  StepCommand c;
  c.op = Op::kForward;
  c.module = module;
  c.done = done;
  return c;
}

StepCommand StepCommand::Backward(int module, bool done) {
  StepCommand c;
  c.op = Op::kBackward;
  c.module = module;
  c.done = done;
  return c;
}

StepCommand StepCommand::Unshard(int unit, bool prefetch) {
  StepCommand c;
  c.op = Op::kUnshard;
  c.unit = unit;
  c.prefetch = prefetch;
  return c;
}

StepCommand StepCommand::Reshard(int unit) {
  StepCommand c;
  c.op = Op::kReshard;
  c.unit = unit;
  return c;
}

StepCommand StepCommand::ReduceGrad(int unit) {
  StepCommand c;
  c.op = Op::kReduceGrad;
  c.unit = unit;
  return c;
}

StepCommand StepCommand::ZeroGrad() {
  StepCommand c;
  c.op = Op::kZeroGrad;
  return c;
}

StepCommand StepCommand::ClipGradNorm(double max_norm, double norm_type) {
  StepCommand c;
  c.op = Op::kClipGradNorm;
  c.max_norm = max_norm;
  c.norm_type = norm_type;
  return c;
}

StepCommand StepCommand::OptimStep() { return StepCommand{}; }

StepCommand StepCommand::Barrier() {
  StepCommand c;
  c.op = Op::kBarrier;
  return c;
}

StepProgramOptions StepProgramOptionsFor(const ShardingSettings& sharding,
                                         const OptimizerSettings& optimizer, int world_size,
                                         bool sync_gradients) {
  StepProgramOptions options;
  options.strategy = EffectiveStrategy(sharding.strategy, world_size);
  options.backward_prefetch = sharding.backward_prefetch;
  options.forward_prefetch = sharding.forward_prefetch;
  options.sync_gradients = sync_gradients;
  options.max_grad_norm = optimizer.max_grad_norm;
  options.grad_norm_type = optimizer.grad_norm_type;
  return options;
}

StepProgram CompileStepProgram(const ModelIndex& index, const std::vector<Unit>& units,
                               const StepProgramOptions& options) {
  return Compiler(index, units, options).Compile();
}

std::string EncodeStepProgram(const StepProgram& program) {
  // The count, then 27 bytes per command: op, module, unit, done, prefetch,
  // max_norm, norm_type (every field, so the encoding needs no per-op schema).
  std::string out;
  out.reserve(8 + program.size() * 27);
  AppendLittleEndian(program.size(), 8, out);
  for (const StepCommand& c : program) {
    AppendLittleEndian(static_cast<uint8_t>(c.op), 1, out);
    AppendLittleEndian(static_cast<uint32_t>(c.module), 4, out);
    AppendLittleEndian(static_cast<uint32_t>(c.unit), 4, out);
    AppendLittleEndian(c.done ? 1 : 0, 1, out);
    AppendLittleEndian(c.prefetch ? 1 : 0, 1, out);
    AppendDouble(c.max_norm, out);
    AppendDouble(c.norm_type, out);
  }
  return out;
}

std::string BatchContentDigest(absl::string_view kind, absl::string_view content) {
  std::string header;
  AppendLittleEndian(kind.size(), 8, header);
  header.append(kind.data(), kind.size());
  XXH3_state_t* state = XXH3_createState();
  XXH3_128bits_reset(state);
  XXH3_128bits_update(state, header.data(), header.size());
  XXH3_128bits_update(state, content.data(), content.size());
  const XXH128_hash_t hash = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, hash);
  return std::string(reinterpret_cast<const char*>(canonical.digest), sizeof(canonical.digest));
}

std::string ProgramDigest(const StepProgram& program, int64_t step, bool sync_gradients) {
  std::string content;
  AppendLittleEndian(static_cast<uint64_t>(step), 8, content);
  AppendLittleEndian(sync_gradients ? 1 : 0, 1, content);
  content += EncodeStepProgram(program);
  return BatchContentDigest("step", content);
}

std::string DescribeCommand(const StepCommand& c) {
  switch (c.op) {
    case StepCommand::Op::kForward:
      return absl::StrCat("Forward", c.done ? "Done(" : "(", c.module, ")");
    case StepCommand::Op::kBackward:
      return absl::StrCat("Backward", c.done ? "Done(" : "(", c.module, ")");
    case StepCommand::Op::kUnshard:
      return absl::StrCat(c.prefetch ? "Prefetch(" : "Unshard(", c.unit, ")");
    case StepCommand::Op::kReshard:
      return absl::StrCat("Reshard(", c.unit, ")");
    case StepCommand::Op::kReduceGrad:
      return absl::StrCat("ReduceGrad(", c.unit, ")");
    case StepCommand::Op::kClipGradNorm:
      return absl::StrCat("ClipGradNorm(", c.max_norm, ")");
    case StepCommand::Op::kOptimStep:
      return "OptimStep";
    case StepCommand::Op::kZeroGrad:
      return "ZeroGrad";
    case StepCommand::Op::kBarrier:
      return "Barrier";
  }
  return absl::StrCat("Command(", static_cast<int>(c.op), ")");
}

}  // namespace flatshard
