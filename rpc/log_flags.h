// The --log-level flag both daemons take (env FLATSHARD_LOG_LEVEL), and the
// stderr logger it sets up: stdout carries the one "listening on" line a
// launcher waits for, logs go to stderr.
#ifndef FLATSHARD_RPC_LOG_FLAGS_H_
#define FLATSHARD_RPC_LOG_FLAGS_H_

#include <string>

#include "CLI/CLI.hpp"

namespace flatshard {

// `level` (default "info") takes trace, debug, info, warn, error or off.
void AddLogLevelFlag(CLI::App& app, std::string& level);

// Makes the default logger write to stderr at `level` and above, named
// "flatshard" as every line says.
void InstallStderrLogger(const std::string& level);

}  // namespace flatshard

#endif  // FLATSHARD_RPC_LOG_FLAGS_H_
