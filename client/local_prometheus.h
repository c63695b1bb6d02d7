// A Prometheus server (the Debian package's binary) scraping a local cluster:
// what `flatshard up --prometheus` runs. It uses deploy/prometheus's local
// scrape configuration and alert rules as installed beside the binaries
// (share/flatshard/prometheus/), with the daemons' /metrics addresses
// written into its file-based service discovery.
#ifndef FLATSHARD_CLIENT_LOCAL_PROMETHEUS_H_
#define FLATSHARD_CLIENT_LOCAL_PROMETHEUS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "client/child_process.h"

namespace flatshard {

struct LocalPrometheusOptions {
  std::string listen = "127.0.0.1:9090";  // port 0: any free one
  // Holds prometheus-local.yml and the rule files it names (default:
  // <this program's directory>/../share/flatshard/prometheus).
  std::string config_dir;
  // Its configuration, targets and TSDB (default: a new directory under
  // $TMPDIR, removed when it stops).
  std::string data_dir;
  double scrape_interval_s = 5;
  std::string binary = "prometheus";  // looked up in PATH unless it has a '/'
  absl::Duration start_timeout = absl::Seconds(60);
  // Readable when nobody should wait for it any more (as
  // LocalClusterOptions::interrupt_fd): Start then ends CANCELLED, the
  // half-started Prometheus killed. -1: none.
  int interrupt_fd = -1;
};

class LocalPrometheus {
 public:
  // The option errors Start would report (a bad address or interval, no
  // binary, no configuration), found before anything is started.
  static absl::Status Check(const LocalPrometheusOptions& options);

  // Starts Prometheus scraping `coordinator` and `workers` (host:port of
  // their /metrics) and returns once it answers /-/ready.
  static absl::StatusOr<std::unique_ptr<LocalPrometheus>> Start(
      const LocalPrometheusOptions& options, const std::string& coordinator,
      const std::vector<std::string>& workers);
  ~LocalPrometheus();  // stops it; removes a data directory it made

  const std::string& url() const { return url_; }  // "http://127.0.0.1:9090"
  const std::string& data_dir() const { return data_dir_; }
  // SIGTERM, then SIGKILL; true when it exited cleanly.
  bool Stop();
  // SIGKILLs it now; callable while another thread is in Stop().
  void Kill() const;
  // Whether stopping it had to SIGKILL it (ChildProcess::killed).
  bool killed() const;
  // Scrapes the coordinator at `coordinator` from now on (a restarted one's
  // /metrics has a new port).
  absl::Status SetCoordinatorTarget(const std::string& coordinator);
  // Scrapes `workers` from now on (a restarted worker's /metrics has a new
  // port); Prometheus re-reads the targets file by itself.
  absl::Status SetWorkerTargets(const std::vector<std::string>& workers);

 private:
  LocalPrometheus() = default;

  std::unique_ptr<ChildProcess> process_;
  std::string url_;
  std::string data_dir_;
  bool remove_data_dir_ = false;
};

}  // namespace flatshard

#endif  // FLATSHARD_CLIENT_LOCAL_PROMETHEUS_H_
