// `flatshard up`: a local cluster (a coordinator and N CPU workers as child
// processes) that runs until Ctrl-C or SIGTERM, then stops them cleanly;
// with --prometheus, a Prometheus server scraping it too.
#ifndef FLATSHARD_CLIENT_UP_COMMAND_H_
#define FLATSHARD_CLIENT_UP_COMMAND_H_

#include <ostream>
#include <string>

#include "CLI/CLI.hpp"

#include "client/local_cluster.h"
#include "client/local_prometheus.h"

namespace flatshard {

struct UpCommandOptions {
  LocalClusterOptions cluster;
  std::string job_file;      // create this job once the workers are up
  std::string address_file;  // write the coordinator's address here
  bool prometheus = false;   // also run a Prometheus scraping the cluster
  bool tls = false;          // mutual TLS and tokens (client/cluster_security.h)
  std::string security_dir;  // default: <checkpoint-dir>/.security
  // On a stop signal, first save each job whose state a restart would not restore, waiting up to
  // this long
  // (0: never save; client/save_before_stop.h).
  double stop_save_timeout_s = 300;
  LocalPrometheusOptions prometheus_options;
};

CLI::App* AddUpCommand(CLI::App& app, UpCommandOptions& options);
int RunUpCommand(const UpCommandOptions& options, std::ostream& out, std::ostream& err);

}  // namespace flatshard

#endif  // FLATSHARD_CLIENT_UP_COMMAND_H_
