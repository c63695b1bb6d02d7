// The `flatshard` subcommands that talk to a coordinator: job create / status
// / delete, workers, train, unshard, reshard, summon, watch. Human-readable by
// default, `--json` for scripts; exit codes in cli_output.h.
#ifndef FLATSHARD_CLIENT_CLUSTER_COMMANDS_H_
#define FLATSHARD_CLIENT_CLUSTER_COMMANDS_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"

#include "client/flatshard_client.h"
#include "flatshard/v1/job.pb.h"

namespace flatshard {

// One line for an automatic recovery, and one for a training operation, as
// `job status` and `train` print them.
std::string RecoverySummary(const v1::Recovery& recovery);
std::string TrainingSummary(const v1::TrainingOperation& training);

class ClusterCommands {
 public:
  // Adds the subcommands to `app`. The object must outlive parsing and Run.
  void Add(CLI::App& app);
  // Runs whichever subcommand was parsed; -1 if none of these was.
  int Run(std::ostream& out, std::ostream& err);

 private:
  int JobCreate(std::ostream& out, std::ostream& err);
  int JobStatus(std::ostream& out, std::ostream& err);
  int JobDelete(std::ostream& out, std::ostream& err);
  int JobStop(std::ostream& out, std::ostream& err);  // train_command.cc
  int Workers(std::ostream& out, std::ostream& err);
  int Train(std::ostream& out, std::ostream& err);  // train_command.cc
  int Unshard(bool unshard, std::ostream& out, std::ostream& err);
  int Summon(std::ostream& out, std::ostream& err);
  int Watch(std::ostream& out, std::ostream& err);

  CoordinatorTarget coordinator_;
  bool json_ = false;
  std::string job_;
  std::string job_file_;
  std::string name_override_;
  bool no_wait_ = false;
  double wait_timeout_s_ = 120;
  int64_t steps_ = 0;
  int micro_steps_ = 0;
  std::string train_log_;  // train --log: one JSON line per step, appended
  bool attach_ = false;
  bool detach_ = false;
  std::vector<int> units_;
  std::string out_path_;
  bool with_grads_ = false;
  int64_t chunk_bytes_ = 0;

  CLI::App* job_create_ = nullptr;
  CLI::App* job_status_ = nullptr;
  CLI::App* job_delete_ = nullptr;
  CLI::App* job_stop_ = nullptr;
  CLI::App* workers_ = nullptr;
  CLI::App* train_ = nullptr;
  CLI::App* unshard_ = nullptr;
  CLI::App* reshard_ = nullptr;
  CLI::App* summon_ = nullptr;
  CLI::App* watch_ = nullptr;
};

}  // namespace flatshard

#endif  // FLATSHARD_CLIENT_CLUSTER_COMMANDS_H_
