// What every cluster subcommand shares: how a failed call becomes a message
// and an exit code, and aligned tables.
//
// Exit codes: 0 done; 1 the operation failed on the cluster (a rank died, the
// job failed); 2 the request was refused (bad input, unknown job or unit,
// wrong state: the message says what to change); 3 no coordinator answered.
#ifndef FLATSHARD_CLIENT_CLI_OUTPUT_H_
#define FLATSHARD_CLIENT_CLI_OUTPUT_H_

#include <ostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "google/protobuf/message.h"

#include "client/flatshard_client.h"

namespace flatshard {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitRefused = 2;
inline constexpr int kExitUnreachable = 3;

int ExitCodeFor(const absl::Status& status);

// Prints "flatshard <command>: <message>" and returns the exit code.
int ReportError(const std::string& command, const absl::Status& status, std::ostream& err);

// Columns padded to their widest cell.
void PrintTable(const std::vector<std::string>& header,
                const std::vector<std::vector<std::string>>& rows, std::ostream& out);

// The options every cluster subcommand takes: -c (env FLATSHARD_COORDINATOR),
// --tls-cert/--tls-key/--tls-ca (FLATSHARD_TLS_*), --token (FLATSHARD_TOKEN)
// and --token-file (FLATSHARD_TOKEN_FILE).
void AddCoordinatorOption(CLI::App* command, CoordinatorTarget& coordinator);
void AddJobOption(CLI::App* command, std::string& job);  // -j, env FLATSHARD_JOB, required

// A message as --json prints it (proto field names, defaults included).
std::string MessageToJson(const google::protobuf::Message& message);

std::string FormatSeconds(double seconds);  // "4.2s", "3m05s"
std::string FormatMillis(double seconds);   // "63ms", "1.2s"

}  // namespace flatshard

#endif  // FLATSHARD_CLIENT_CLI_OUTPUT_H_
