// Per-module callbacks around forward and backward, in PyTorch module-hook
// order, so the FSDP runtime can unshard a unit when its module starts and
// reshard it when the module is done (docs/fsdp-semantics.md §2.3-2.4, §9.2). The layer
// library only calls hooks; it never decides anything about sharding.
#ifndef FLATSHARD_WORKER_COMPUTE_MODULE_HOOKS_H_
#define FLATSHARD_WORKER_COMPUTE_MODULE_HOOKS_H_

#include "absl/status/status.h"

namespace flatshard::compute {

// Called for EVERY module, containers and the root (index 0) included, with its
// ModelIndex pre-order index. Forward: BeforeForward(m) when m's forward starts,
// AfterForward(m) when it ends; children nest inside. Backward visits modules in
// reverse execution order: BeforeBackward(m) before any of m's (and its
// subtree's) backward work, AfterBackward(m) after every parameter grad in m's
// subtree is final (a tied parameter's grad is final only once both its uses are
// done; FSDP keeps ties inside one unit, whose module encloses both). A hook's
// error aborts the pass and is returned unchanged; after any failure no more
// hooks fire, so a BeforeX without its AfterX means the pass failed.
class ModuleHooks {
 public:
  virtual ~ModuleHooks() = default;
  virtual absl::Status BeforeForward(int module_index) = 0;
  virtual absl::Status AfterForward(int module_index) = 0;
  virtual absl::Status BeforeBackward(int module_index) = 0;
  virtual absl::Status AfterBackward(int module_index) = 0;
};

// Hooks that do nothing: single-process training and tests.
class NoopModuleHooks : public ModuleHooks {
 public:
  absl::Status BeforeForward(int) override { return absl::OkStatus(); }
  absl::Status AfterForward(int) override { return absl::OkStatus(); }
  absl::Status BeforeBackward(int) override { return absl::OkStatus(); }
  absl::Status AfterBackward(int) override { return absl::OkStatus(); }
};

}  // namespace flatshard::compute

#endif  // FLATSHARD_WORKER_COMPUTE_MODULE_HOOKS_H_
