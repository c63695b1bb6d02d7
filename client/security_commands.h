// `flatshard certs init DIR` (a cluster CA and the coordinator's, workers' and
// an admin's certificates), `certs renew DIR` (them again, from that CA) and `flatshard token
// create` (a bearer token, its line appended to a coordinator's --tokens-file).
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
  int CertsRenew(std::ostream& out, std::ostream& err);
  int TokenCreate(std::ostream& out, std::ostream& err);

  CLI::App* certs_init_ = nullptr;
  CLI::App* certs_renew_ = nullptr;
  CLI::App* token_create_ = nullptr;
  std::string certs_dir_;
  std::vector<std::string> hosts_;
  int days_ = 365;
  int ca_days_ = 3650;
  int renew_within_days_ = 30;
  bool renew_all_ = false;
  bool new_ca_if_needed_ = false;
  std::string token_name_;
  std::string token_role_;
  std::string tokens_file_;
};

}  // namespace flatshard

#endif  // FLATSHARD_CLIENT_SECURITY_COMMANDS_H_
