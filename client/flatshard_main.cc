// The `flatshard` command line.
#include <iostream>

#include "CLI/CLI.hpp"

#include "client/plan_command.h"

namespace {

int Run(int argc, char** argv) {
  CLI::App app{"flatshard: fully sharded data parallel training as a service"};
  app.require_subcommand(1);
  flatshard::PlanCommandOptions plan_options;
  CLI::App* plan = flatshard::AddPlanCommand(app, plan_options);
  CLI11_PARSE(app, argc, argv);
  if (plan->parsed()) return flatshard::RunPlanCommand(plan_options, std::cout, std::cerr);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // CLI11 reports through exceptions; nothing else here throws on purpose, but a
  // failed allocation must still end with a message rather than std::terminate.
  try {
    return Run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "flatshard: " << e.what() << "\n";
    return 1;
  }
}
