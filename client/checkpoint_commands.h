// `flatshard ckpt ...`: checkpoints through the coordinator (save, load, ls,
// rm) and offline on a checkpoint directory, with no cluster (inspect,
// verify, consolidate, reshard). Exit codes as in cli_output.h; offline
// verification failures exit 1 naming the file.
#ifndef FLATSHARD_CLIENT_CHECKPOINT_COMMANDS_H_
#define FLATSHARD_CLIENT_CHECKPOINT_COMMANDS_H_

#include <ostream>
#include <string>

#include "CLI/CLI.hpp"

#include "client/flatshard_client.h"

namespace flatshard {

class CheckpointCommands {
 public:
  void Add(CLI::App& app);
  // Runs whichever ckpt subcommand was parsed; -1 if none was.
  int Run(std::ostream& out, std::ostream& err);

 private:
  int Save(std::ostream& out, std::ostream& err);
  int Load(std::ostream& out, std::ostream& err);
  int List(std::ostream& out, std::ostream& err);
  int Remove(std::ostream& out, std::ostream& err);
  int Inspect(std::ostream& out, std::ostream& err);
  int Verify(std::ostream& out, std::ostream& err);
  int Convert(bool consolidate, std::ostream& out, std::ostream& err);

  CoordinatorTarget coordinator_;
  bool json_ = false;
  std::string job_;
  std::string name_;
  std::string type_;
  std::string path_;
  std::string out_path_;
  int world_size_ = 0;
  bool async_ = false;

  CLI::App* save_ = nullptr;
  CLI::App* load_ = nullptr;
  CLI::App* ls_ = nullptr;
  CLI::App* rm_ = nullptr;
  CLI::App* inspect_ = nullptr;
  CLI::App* verify_ = nullptr;
  CLI::App* consolidate_ = nullptr;
  CLI::App* reshard_ = nullptr;
};

}  // namespace flatshard

#endif  // FLATSHARD_CLIENT_CHECKPOINT_COMMANDS_H_
