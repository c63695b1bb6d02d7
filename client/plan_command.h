// `flatshard plan`: the dry run of a job from a model spec, without a cluster.
#ifndef FLATSHARD_CLIENT_PLAN_COMMAND_H_
#define FLATSHARD_CLIENT_PLAN_COMMAND_H_

#include <ostream>
#include <string>

#include "CLI/CLI.hpp"

namespace flatshard {

struct PlanCommandOptions {
  std::string model_path;
  std::string job_path;  // a job file instead of the model and flags
  std::string policy = "none";
  int world_size = 1;
  std::string strategy = "FULL_SHARD";
  int hybrid_shard_group_size = 0;
  bool use_orig_params = false;
  std::string param_dtype;  // empty: no mixed precision
  std::string reduce_dtype;
  std::string optimizer = "adamw";
  bool amsgrad = false;
  bool no_limit_all_gathers = false;
  bool json = false;
};

// Adds the `plan` subcommand to `app`; the returned options are filled by CLI11.
CLI::App* AddPlanCommand(CLI::App& app, PlanCommandOptions& options);

// Runs it: writes the plan to `out`, errors to `err`. Returns the exit code
// (0 ok, 2 bad input).
int RunPlanCommand(const PlanCommandOptions& options, std::ostream& out, std::ostream& err);

}  // namespace flatshard

#endif  // FLATSHARD_CLIENT_PLAN_COMMAND_H_
