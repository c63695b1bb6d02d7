#include "client/cluster_security.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <fcntl.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "rpc/cluster_certificates.h"
#include "rpc/secrets.h"

#include "coordinator/service/access_policy.h"
#include "core/status_macros.h"

namespace flatshard {

absl::Status WritePrivateFile(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot create ", tmp, ": ", strerror(errno)));
  }
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                  ::fsync(fd) == 0;
  ::close(fd);
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<ClusterSecurity> PrepareClusterSecurity(const std::string& dir,
                                                       const std::vector<std::string>& hosts) {
  namespace fs = std::filesystem;
  if (!fs::exists(fs::path(dir) / "ca.pem")) {
    RETURN_IF_ERROR(WriteClusterCertificates(dir, hosts).status());
  }
  ClusterSecurity s;
  s.dir = dir;
  auto file = [&](const std::string& name) { return (fs::path(dir) / name).string(); };
  for (auto [tls, name] : {std::pair{&s.coordinator, "coordinator"}, std::pair{&s.worker, "worker"},
                           std::pair{&s.admin, "admin"}}) {
    *tls = TlsFiles{file(absl::StrCat(name, ".pem")), file(absl::StrCat(name, "-key.pem")),
                    file("ca.pem")};
  }
  s.admin_token = RandomSecret();
  s.join_token = RandomSecret();
  s.tokens_file = file("tokens");
  s.admin_token_file = file("admin.token");
  RETURN_IF_ERROR(WritePrivateFile(
      s.tokens_file,
      absl::StrCat("# made by flatshard for a local cluster: <sha256> <name> <role>\n",
                   TokenTable::Line(s.admin_token, "local-admin", Role::kAdmin), "\n",
                   TokenTable::Line(s.join_token, "local-workers", Role::kWorker), "\n")));
  RETURN_IF_ERROR(WritePrivateFile(s.admin_token_file, s.admin_token + "\n"));
  RETURN_IF_ERROR(WritePrivateFile(file("join.token"), s.join_token + "\n"));
  return s;
}

std::vector<std::string> ClusterSecurity::CoordinatorFlags() const {
  return {"--tls-cert",    coordinator.cert,
          "--tls-key",     coordinator.key,
          "--tls-ca",      coordinator.ca,
          "--tokens-file", tokens_file,
          "--audit-log",   (std::filesystem::path(dir) / "audit.log").string()};
}

std::vector<std::string> ClusterSecurity::WorkerFlags() const {
  return {"--tls-cert",        worker.cert,
          "--tls-key",         worker.key,
          "--tls-ca",          worker.ca,
          "--join-token-file", (std::filesystem::path(dir) / "join.token").string()};
}

CoordinatorTarget ClusterSecurity::AdminTarget(const std::string& address) const {
  return CoordinatorTarget{address, admin, admin_token, ""};
}

}  // namespace flatshard
