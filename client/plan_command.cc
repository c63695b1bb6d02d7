#include "client/plan_command.h"

#include <tuple>

#include "absl/strings/str_cat.h"

#include "client/plan_printer.h"
#include "core/job_config.h"
#include "core/job_spec_yaml.h"
#include "core/model_spec_yaml.h"
#include "core/plan.h"
#include "storage/spec_files.h"

namespace flatshard {
namespace {

// `--optimizer sgd-momentum`: SGD that keeps a momentum buffer (the plan's
// name for it, PlanOptimizerName). Any momentum != 0 plans the same.
constexpr absl::string_view kSgdMomentum = "sgd-momentum";
constexpr double kPlanMomentum = 0.9;

}  // namespace

CLI::App* AddPlanCommand(CLI::App& app, PlanCommandOptions& o) {
  CLI::App* plan = app.add_subcommand(
      "plan",
      "Dry-run a job without a cluster: units, each rank's shard ranges and "
      "parameter slices, per-rank memory, and the bytes each collective moves per step");
  CLI::Option* model = plan->add_option("--model,-m", o.model_path,
                                        "Model spec (YAML or JSON), e.g. examples/gpt-7m.yaml");
  CLI::Option* job = plan->add_option(
      "--job,-f", o.job_path,
      "A job file instead (docs/job-spec.md): its model, policy, world size, sharding and "
      "optimizer; the other options are ignored");
  model->excludes(job);
  plan->callback([model, job] {
    if (model->count() == 0 && job->count() == 0) {
      throw CLI::RequiredError("--model or --job");
    }
  });
  plan->add_option("--policy,-p", o.policy,
                   "Wrap policy: none | always | module-type:TYPE[,TYPE] | "
                   "size:MIN_NUM_PARAMS | fqn:MODULE[,MODULE]")
      ->capture_default_str();
  plan->add_option("--world-size,-w", o.world_size, "Number of ranks")->capture_default_str();
  plan->add_option("--strategy,-s", o.strategy,
                   "FULL_SHARD | SHARD_GRAD_OP | NO_SHARD | HYBRID_SHARD | HYBRID_SHARD_ZERO2")
      ->capture_default_str();
  plan->add_option("--hybrid-shard-size", o.hybrid_shard_group_size,
                   "Ranks per shard group for the hybrid strategies (must divide the world size)");
  plan->add_flag(
      "--use-orig-params", o.use_orig_params,
      "Lay out as FSDP's use_orig_params=True (16-byte alignment and world-size padding)");
  plan->add_option("--param-dtype", o.param_dtype,
                   "Mixed precision: dtype of the all-gather and compute (e.g. bfloat16)");
  plan->add_option("--reduce-dtype", o.reduce_dtype,
                   "Mixed precision: dtype of the gradient reduction (default: --param-dtype)");
  plan->add_option("--optimizer", o.optimizer, "sgd | sgd-momentum | adam | adamw")
      ->capture_default_str();
  plan->add_flag("--amsgrad", o.amsgrad, "Adam/AdamW with amsgrad (one more state tensor)");
  plan->add_flag("--no-limit-all-gathers", o.no_limit_all_gathers,
                 "Plan memory as if limit_all_gathers=False");
  plan->add_flag("--json", o.json, "Print the stable JSON form (docs/plan-json.md)");
  return plan;
}

int RunPlanCommand(const PlanCommandOptions& o, std::ostream& out, std::ostream& err) {
  auto fail = [&](const absl::Status& status) {
    err << "flatshard plan: " << status.message() << "\n";
    return 2;
  };
  auto print = [&](const absl::StatusOr<Plan>& plan) {
    if (!plan.ok()) return fail(plan.status());
    if (o.json) {
      out << PlanToJson(*plan) << "\n";
    } else {
      PrintPlan(*plan, out);
    }
    return 0;
  };
  if (!o.job_path.empty()) {
    absl::StatusOr<v1::JobSpec> job = LoadJobSpecFile(o.job_path);
    if (!job.ok()) return fail(job.status());
    absl::StatusOr<JobConfig> config = JobConfigFromProto(*job);
    if (!config.ok()) return fail(config.status());
    return print(ComputePlan(config->model, config->wrap_policy, config->world_size,
                             config->sharding, config->optimizer));
  }
  absl::StatusOr<ModelSpec> spec = LoadModelSpecFile(o.model_path);
  if (!spec.ok()) return fail(spec.status());
  absl::StatusOr<WrapPolicy> policy = ParseWrapPolicy(o.policy);
  if (!policy.ok()) return fail(policy.status());
  // The flags fill the same two settings structs a job file does.
  ShardingSettings sharding;
  absl::StatusOr<ShardingStrategy> strategy = ParseShardingStrategy(o.strategy);
  if (!strategy.ok()) return fail(strategy.status());
  sharding.strategy = *strategy;
  sharding.hybrid_shard_group_size = o.hybrid_shard_group_size;
  sharding.use_orig_params = o.use_orig_params;
  for (const auto& [flag, text, target] :
       {std::tuple{"--param-dtype", &o.param_dtype, &sharding.param_dtype},
        std::tuple{"--reduce-dtype", &o.reduce_dtype, &sharding.reduce_dtype}}) {
    if (text->empty()) continue;
    absl::StatusOr<DType> dtype = ParseDType(*text);
    if (!dtype.ok()) {
      return fail(absl::InvalidArgumentError(std::string(flag) + ": " +
                                             std::string(dtype.status().message())));
    }
    *target = *dtype;
  }
  sharding.limit_all_gathers = !o.no_limit_all_gathers;
  OptimizerSettings optimizer;
  if (o.optimizer == kSgdMomentum) {
    // Only whether SGD keeps a momentum buffer matters to the plan.
    optimizer.kind = OptimizerKind::kSgd;
    optimizer.sgd.momentum = kPlanMomentum;
  } else {
    absl::StatusOr<OptimizerKind> kind = ParseOptimizerKind(o.optimizer);
    if (!kind.ok()) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
          "unknown optimizer '", o.optimizer, "'; expected sgd, sgd-momentum, adam or adamw")));
    }
    optimizer.kind = *kind;
  }
  optimizer.adam.amsgrad = o.amsgrad;

  return print(ComputePlan(*spec, *policy, o.world_size, sharding, optimizer));
}

}  // namespace flatshard
