// The `flatshard` command line.
#include <iostream>

#include "CLI/CLI.hpp"
#include "rpc/mutex_deadlock_detection.h"

#include "client/checkpoint_commands.h"
#include "client/cluster_commands.h"
#include "client/model_commands.h"
#include "client/plan_command.h"
#include "client/security_commands.h"
#include "client/up_command.h"

namespace {

int Run(int argc, char** argv) {
  CLI::App app{"flatshard: fully sharded data parallel training as a service"};
  app.footer(
      "Start with `flatshard up --listen 127.0.0.1:7070` (a local cluster; without --listen it "
      "takes a free port and prints it), then `flatshard job create -f examples/mlp-job.yaml` "
      "and `flatshard train -j mlp-demo --steps 50`.\n"
      "Exit codes: 0 done; 1 the operation failed on the cluster; 2 the request was refused "
      "(the message says what to change); 3 no coordinator answered.");
  app.require_subcommand(1);
  flatshard::PlanCommandOptions plan_options;
  CLI::App* plan = flatshard::AddPlanCommand(app, plan_options);
  flatshard::UpCommandOptions up_options;
  CLI::App* up = flatshard::AddUpCommand(app, up_options);
  flatshard::ClusterCommands cluster;
  cluster.Add(app);
  flatshard::CheckpointCommands checkpoints;
  checkpoints.Add(app);
  flatshard::SecurityCommands security;
  security.Add(app);
  flatshard::ModelCommands models;
  models.Add(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help exits 0; a usage error is a refused request (exit code 2).
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (plan->parsed()) return flatshard::RunPlanCommand(plan_options, std::cout, std::cerr);
  if (up->parsed()) return flatshard::RunUpCommand(up_options, std::cout, std::cerr);
  if (int code = checkpoints.Run(std::cout, std::cerr); code >= 0) return code;
  if (int code = security.Run(std::cout, std::cerr); code >= 0) return code;
  if (int code = models.Run(std::cout, std::cerr); code >= 0) return code;
  return cluster.Run(std::cout, std::cerr);
}

}  // namespace

int main(int argc, char** argv) {
  flatshard::TurnOffMutexDeadlockDetection();
  // CLI11 reports through exceptions; nothing else here throws on purpose, but a
  // failed allocation must still end with a message rather than std::terminate.
  try {
    return Run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "flatshard: " << e.what() << "\n";
    return 1;
  }
}
