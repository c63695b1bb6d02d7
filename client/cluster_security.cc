#include "client/cluster_security.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "rpc/cluster_certificates.h"
#include "rpc/secrets.h"

#include "coordinator/service/access_policy.h"
#include "core/status_macros.h"
#include "storage/durable_file.h"

namespace flatshard {

absl::StatusOr<ClusterSecurity> PrepareClusterSecurity(const std::string& dir,
                                                       const std::vector<std::string>& hosts) {
  namespace fs = std::filesystem;
  ClusterSecurity s;
  if (!fs::exists(fs::path(dir) / "ca.pem")) {
    RETURN_IF_ERROR(WriteClusterCertificates(dir, hosts).status());
  } else {
    RenewalOptions renewal;
    renewal.hosts = hosts;
    // The directory is this command's own: a CA that cannot sign, or soon
    // signs nothing that lasts, is replaced, with everything it signed.
    renewal.new_ca_if_needed = true;
    ASSIGN_OR_RETURN(RenewalReport report, RenewClusterCertificates(dir, renewal));
    s.renewed = std::move(report.renewed);
  }
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
  RETURN_IF_ERROR(WriteFileDurably(
      s.tokens_file,
      absl::StrCat("# made by flatshard for a local cluster: <sha256> <name> <role>\n",
                   TokenTable::Line(s.admin_token, "local-admin", Role::kAdmin), "\n",
                   TokenTable::Line(s.join_token, "local-workers", Role::kWorker), "\n"),
      0600));
  RETURN_IF_ERROR(WriteFileDurably(s.admin_token_file, s.admin_token + "\n", 0600));
  RETURN_IF_ERROR(WriteFileDurably(file("join.token"), s.join_token + "\n", 0600));
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
