#include "client/local_prometheus.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <curl/curl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "yaml-cpp/yaml.h"

#include "client/local_cluster.h"
#include "core/status_macros.h"

namespace flatshard {
namespace {

// Whether `fd` (when not -1) is readable now.
bool Readable(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

namespace fs = std::filesystem;

constexpr char kConfigFile[] = "prometheus-local.yml";

absl::StatusOr<std::string> FindBinary(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    if (access(name.c_str(), X_OK) == 0) return name;
    return absl::NotFoundError(absl::StrCat("--prometheus-binary: ", name, " is not executable"));
  }
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path == nullptr ? "" : path, ':')) {
    const std::string candidate = absl::StrCat(dir, "/", name);
    if (!dir.empty() && access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return absl::NotFoundError(
      absl::StrCat("'", name,
                   "' is not in PATH: install Prometheus (Debian: apt-get install prometheus; "
                   "scripts/setup.sh does) or pass --prometheus-binary"));
}

// A loopback port nobody listens on right now. Prometheus cannot report the
// port it bound, so port 0 is resolved here; Start retries if it is taken
// in between.
absl::StatusOr<int> FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  close(fd);
  if (!ok) return absl::UnavailableError("no free loopback port for Prometheus");
  return ntohs(addr.sin_port);
}

// The deploy configuration with this run's intervals and absolute rule paths.
absl::StatusOr<std::string> RenderConfig(const std::string& config_dir, double interval_s) {
  const std::string path = absl::StrCat(config_dir, "/", kConfigFile);
  // yaml-cpp reports through exceptions: none leaves this function.
  try {
    YAML::Node config = YAML::LoadFile(path);
    const std::string interval = absl::StrCat(interval_s * 1000, "ms");
    config["global"]["scrape_interval"] = interval;
    config["global"]["evaluation_interval"] = interval;
    YAML::Node rules = config["rule_files"];
    for (size_t i = 0; rules.IsSequence() && i < rules.size(); ++i) {
      const std::string file = rules[i].as<std::string>();
      if (!file.empty() && file.front() != '/') rules[i] = absl::StrCat(config_dir, "/", file);
    }
    YAML::Emitter out;
    out << config;
    return std::string(out.c_str());
  } catch (const YAML::BadFile& e) {
    return absl::NotFoundError(
        absl::StrCat("cannot read ", path, " (", e.what(),
                     "); pass --prometheus-config-dir with deploy/prometheus of this checkout"));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", e.what()));
  }
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

// Whole or not at all (written aside, then renamed): Prometheus re-reads
// the file whenever it changes, also while `up` rewrites it.
absl::Status WriteTargets(const std::string& path, const std::vector<std::string>& targets) {
  nlohmann::json groups = nlohmann::json::array();
  groups.push_back({{"targets", targets}, {"labels", {{"cluster", "local"}}}});
  const std::string aside = path + ".tmp";
  RETURN_IF_ERROR(WriteFile(aside, groups.dump(2) + "\n"));
  std::error_code ec;
  fs::rename(aside, path, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", ec.message()));
  return absl::OkStatus();
}

// 200 from GET url.
bool Answers(const std::string& url) {
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return false;
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, 1000L);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(
      curl, CURLOPT_WRITEFUNCTION, +[](char*, size_t size, size_t n, void*) { return size * n; });
  long code = 0;  // NOLINT(google-runtime-int): curl's type
  const bool ok = curl_easy_perform(curl) == CURLE_OK &&
                  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &code) == CURLE_OK && code == 200;
  curl_easy_cleanup(curl);
  return ok;
}

// What Start needs from the options, checked.
struct Resolved {
  std::string host;
  int port = 0;
  std::string binary;
  std::string config;  // the rendered prometheus.yml
};

absl::StatusOr<Resolved> Resolve(const LocalPrometheusOptions& options) {
  if (options.scrape_interval_s <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--scrape-interval must be positive, got ", options.scrape_interval_s));
  }
  Resolved r;
  const size_t colon = options.listen.rfind(':');
  if (colon == std::string::npos || !absl::SimpleAtoi(options.listen.substr(colon + 1), &r.port) ||
      r.port < 0 || r.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--prometheus-listen '", options.listen,
                                                   "' must be host:port (port 0: any free one)"));
  }
  r.host = options.listen.substr(0, colon);
  ASSIGN_OR_RETURN(r.binary, FindBinary(options.binary));
  const std::string config_dir =
      options.config_dir.empty()
          ? absl::StrCat(LocalCluster::SelfDirectory(), "/../share/flatshard/prometheus")
          : options.config_dir;
  ASSIGN_OR_RETURN(r.config, RenderConfig(config_dir, options.scrape_interval_s));
  return r;
}

}  // namespace

absl::Status LocalPrometheus::Check(const LocalPrometheusOptions& options) {
  return Resolve(options).status();
}

absl::StatusOr<std::unique_ptr<LocalPrometheus>> LocalPrometheus::Start(
    const LocalPrometheusOptions& options, const std::string& coordinator,
    const std::vector<std::string>& workers) {
  ASSIGN_OR_RETURN(const Resolved resolved, Resolve(options));
  const std::string& host = resolved.host;
  const int port = resolved.port;
  const std::string& binary = resolved.binary;
  const std::string& config = resolved.config;
  std::unique_ptr<LocalPrometheus> prometheus(new LocalPrometheus());
  if (options.data_dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        absl::StrCat(tmp == nullptr ? "/tmp" : tmp, "/flatshard-prometheus-XXXXXX");
    if (mkdtemp(pattern.data()) == nullptr) {
      return absl::UnavailableError(absl::StrCat("cannot create a directory like ", pattern));
    }
    prometheus->data_dir_ = pattern;
    prometheus->remove_data_dir_ = true;
  } else {
    prometheus->data_dir_ = options.data_dir;
  }
  const std::string& dir = prometheus->data_dir_;
  std::error_code ec;
  fs::create_directories(dir + "/targets", ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  RETURN_IF_ERROR(WriteFile(dir + "/prometheus.yml", config));
  RETURN_IF_ERROR(WriteTargets(dir + "/targets/coordinator.json", {coordinator}));
  RETURN_IF_ERROR(prometheus->SetWorkerTargets(workers));

  // A port picked here can be taken before Prometheus binds it: try again.
  const int attempts = port == 0 ? 3 : 1;
  absl::Status last;
  for (int attempt = 0; attempt < attempts; ++attempt) {
    int bound = port;
    if (bound == 0) {
      ASSIGN_OR_RETURN(bound, FreePort());
    }
    const std::string listen = absl::StrCat(host, ":", bound);
    ASSIGN_OR_RETURN(prometheus->process_,
                     ChildProcess::Spawn({binary, "--config.file=" + dir + "/prometheus.yml",
                                          "--storage.tsdb.path=" + dir + "/tsdb",
                                          "--web.listen-address=" + listen, "--log.level=error"}));
    prometheus->url_ = absl::StrCat("http://", listen);
    const absl::Time deadline = absl::Now() + options.start_timeout;
    while (absl::Now() < deadline) {
      if (Answers(prometheus->url_ + "/-/ready")) return prometheus;
      if (Readable(options.interrupt_fd)) {
        prometheus->process_->Kill();  // it holds nothing yet
        return absl::CancelledError(
            absl::StrCat("interrupted while waiting for prometheus to be ready on ", listen));
      }
      if (prometheus->process_->Wait(absl::Milliseconds(100)).has_value()) break;
    }
    const std::optional<int> exited = prometheus->process_->Wait(absl::ZeroDuration());
    last = exited.has_value() ? absl::UnavailableError(absl::StrCat(
                                    "prometheus exited (status ", *exited,
                                    ") before it was ready on ", listen, "; its log is above"))
                              : absl::DeadlineExceededError(
                                    absl::StrCat("prometheus was not ready on ", listen, " after ",
                                                 absl::FormatDuration(options.start_timeout)));
    prometheus->process_.reset();
    if (!exited.has_value()) break;
  }
  return last;
}

absl::Status LocalPrometheus::SetCoordinatorTarget(const std::string& coordinator) {
  return WriteTargets(data_dir_ + "/targets/coordinator.json", {coordinator});
}

absl::Status LocalPrometheus::SetWorkerTargets(const std::vector<std::string>& workers) {
  return WriteTargets(data_dir_ + "/targets/workers.json", workers);
}

bool LocalPrometheus::Stop() {
  if (process_ == nullptr) return true;
  // Kept (a second Stop() returns the same status): Kill() may read it meanwhile.
  const int status = process_->Terminate(absl::Seconds(10));
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

bool LocalPrometheus::killed() const { return process_ != nullptr && process_->killed(); }

void LocalPrometheus::Kill() const {
  if (process_ != nullptr) process_->Kill();
}

LocalPrometheus::~LocalPrometheus() {
  Stop();
  if (remove_data_dir_) {
    std::error_code ec;
    fs::remove_all(data_dir_, ec);
  }
}

}  // namespace flatshard
