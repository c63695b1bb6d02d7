#include "rpc/log_flags.h"

#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace flatshard {

void AddLogLevelFlag(CLI::App& app, std::string& level) {
  if (level.empty()) level = "info";
  app.add_option("--log-level", level,
                 "Least severe log lines written to stderr: trace, debug, info, warn, error or "
                 "off (env FLATSHARD_LOG_LEVEL; warn keeps failures and recoveries and drops "
                 "the per-request audit and per-checkpoint lines)")
      ->envname("FLATSHARD_LOG_LEVEL")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}))
      ->capture_default_str();
}

void InstallStderrLogger(const std::string& level) {
  spdlog::set_default_logger(spdlog::stderr_color_mt("flatshard"));
  spdlog::set_level(spdlog::level::from_str(level));
}

}  // namespace flatshard
