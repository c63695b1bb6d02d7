// `flatshard certs init DIR` (a cluster CA and the coordinator's, workers' and
// an admin's certificates) and `flatshard token create` (a bearer token, its
// line appended to a coordinator's --tokens-file).
#ifndef FLATSHARD_CLIENT_SECURITY_COMMANDS_H_
#define FLATSHARD_CLIENT_SECURITY_COMMANDS_H_

#include <ostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"

namespace flatshard {

class SecurityCommands {
 public:
  void Add(CLI::App& app);
  // The exit code when one of these commands was parsed, else -1.
  int Run(std::ostream& out, std::ostream& err);

 private:
  int CertsInit(std::ostream& out, std::ostream& err);
  int TokenCreate(std::ostream& out, std::ostream& err);

  CLI::App* certs_init_ = nullptr;
  CLI::App* token_create_ = nullptr;
  std::string certs_dir_;
  std::vector<std::string> hosts_;
  int days_ = 365;
  std::string token_name_;
  std::string token_role_;
  std::string tokens_file_;
};

}  // namespace flatshard

#endif  // FLATSHARD_CLIENT_SECURITY_COMMANDS_H_
