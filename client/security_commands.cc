#include "client/security_commands.h"

#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "rpc/certificate_renewal.h"
#include "rpc/cluster_certificates.h"
#include "rpc/secrets.h"

#include "client/cli_output.h"
#include "coordinator/service/access_policy.h"

namespace flatshard {

void SecurityCommands::Add(CLI::App& app) {
  CLI::App* certs = app.add_subcommand("certs", "Certificates for TLS and mutual TLS");
  certs->require_subcommand(1);
  certs_init_ = certs->add_subcommand(
      "init",
      "Create a cluster CA and certificates for the coordinator, the workers and an admin "
      "client in DIR (ca.pem, coordinator.pem, worker.pem, admin.pem and their -key.pem)");
  certs_init_->add_option("dir", certs_dir_, "Directory to create them in")->required();
  certs_init_
      ->add_option("--hosts", hosts_,
                   "Names and addresses the coordinator and workers are dialed at "
                   "(comma-separated; localhost, 127.0.0.1 and ::1 are always included)")
      ->delimiter(',');
  certs_init_->add_option("--days", days_, "Validity of the certificates but the CA's")
      ->capture_default_str()
      ->check(CLI::Range(1, 3650));
  certs_init_
      ->add_option("--ca-days", ca_days_,
                   "Validity of the CA: no certificate it signs, renewed or not, outlasts it")
      ->capture_default_str()
      ->check(CLI::Range(1, 36500));

  certs_renew_ = certs->add_subcommand(
      "renew",
      "Issue the coordinator's, workers' and admin's certificates in DIR again from its CA (every "
      "certificate the CA signed stays valid), each that expires within --within-days, names "
      "other hosts than --hosts, lacks its role's name, has a missing or wrong key, or was not "
      "signed by ca.pem; then copy them to where they are used and restart the daemons");
  certs_renew_->add_option("dir", certs_dir_, "Directory `certs init` made")->required();
  certs_renew_
      ->add_option(
          "--hosts", hosts_,
          "Names and addresses the coordinator and workers are dialed at (comma-separated; "
          "default: those their certificates name now)")
      ->delimiter(',');
  certs_renew_->add_option("--days", days_, "Validity of each renewed certificate")
      ->capture_default_str()
      ->check(CLI::Range(1, 3650));
  certs_renew_
      ->add_option("--within-days", renew_within_days_,
                   "Renew a certificate that expires within this many days")
      ->capture_default_str()
      ->check(CLI::Range(0, 3650));
  certs_renew_->add_flag("--all", renew_all_, "Renew every certificate, whatever it says");
  certs_renew_->add_flag(
      "--new-ca-if-needed", new_ca_if_needed_,
      "Replace a CA that expired, expires within --within-days or whose key is not its key by a "
      "new one (the old kept as ca.pem.old), with every certificate: for directories only "
      "flatshard's own daemons use, since certificates copied elsewhere stop working");

  CLI::App* token = app.add_subcommand("token", "Bearer tokens for the coordinator");
  token->require_subcommand(1);
  token_create_ = token->add_subcommand(
      "create",
      "Make a token: printed once on stdout; its SHA-256 line is appended to --tokens-file "
      "(or printed on stderr), so the file never holds the token itself");
  token_create_->add_option("--name", token_name_, "Who the token is for (in the audit log)")
      ->required();
  token_create_->add_option("--role", token_role_, "viewer, operator, admin or worker (join)")
      ->required();
  token_create_->add_option("--tokens-file", tokens_file_,
                            "The coordinator's tokens file to append to (created mode 0600)");
}

int SecurityCommands::Run(std::ostream& out, std::ostream& err) {
  if (certs_init_ != nullptr && certs_init_->parsed()) return CertsInit(out, err);
  if (certs_renew_ != nullptr && certs_renew_->parsed()) return CertsRenew(out, err);
  if (token_create_ != nullptr && token_create_->parsed()) return TokenCreate(out, err);
  return -1;
}

int SecurityCommands::CertsInit(std::ostream& out, std::ostream& err) {
  absl::StatusOr<std::vector<std::string>> written = WriteClusterCertificates(
      certs_dir_, hosts_, absl::Hours(24) * days_, absl::Hours(24) * ca_days_);
  if (!written.ok()) return ReportError("certs init", written.status(), err);
  for (const std::string& path : *written) out << "wrote " << path << "\n";
  out << "Start the coordinator with --tls-cert " << certs_dir_ << "/coordinator.pem --tls-key "
      << certs_dir_ << "/coordinator-key.pem --tls-ca " << certs_dir_
      << "/ca.pem, each worker with worker.pem the same way, and clients with admin.pem.\n"
      << "Keep ca-key.pem offline: whoever holds it can mint any identity.\n";
  return kExitOk;
}

int SecurityCommands::CertsRenew(std::ostream& out, std::ostream& err) {
  RenewalOptions options;
  options.hosts = hosts_;
  options.valid_for = absl::Hours(24) * days_;
  options.expiring_within = absl::Hours(24) * renew_within_days_;
  options.all = renew_all_;
  options.new_ca_if_needed = new_ca_if_needed_;
  absl::StatusOr<RenewalReport> report = RenewClusterCertificates(certs_dir_, options);
  if (!report.ok()) return ReportError("certs renew", report.status(), err);
  for (const RenewedCertificate& r : report->renewed) {
    out << "renewed " << certs_dir_ << "/" << r.file << ".pem and its key: it " << r.why << "\n";
  }
  if (report->renewed.empty()) {
    out << "nothing to renew in " << certs_dir_ << " (--all renews every certificate)\n";
  } else {
    const bool new_ca = report->renewed.front().file == "ca";
    out << "Copy them to where they are used and restart those daemons"
        << (new_ca ? ", and give every client the new ca.pem.\n" : "; the CA is unchanged.\n");
  }
  const std::string ca_end =
      absl::FormatTime("%Y-%m-%d %H:%M UTC", report->ca_not_after, absl::UTCTimeZone());
  if (report->ca_not_after - absl::Now() < options.expiring_within) {
    err << "warning: the CA in " << certs_dir_ << " expires " << ca_end
        << " and no certificate it signs lasts longer: make a new CA (`flatshard certs init` in "
           "another directory, or --new-ca-if-needed where only flatshard's daemons use DIR) and "
           "move every daemon and client to it before then\n";
  } else {
    out << "The CA is valid until " << ca_end << ".\n";
  }
  return kExitOk;
}

int SecurityCommands::TokenCreate(std::ostream& out, std::ostream& err) {
  absl::StatusOr<Role> role = ParseRole(token_role_);
  if (!role.ok()) {
    return ReportError(
        "token create",
        absl::InvalidArgumentError(absl::StrCat("--role: ", role.status().message())), err);
  }
  if (token_name_.find_first_of(" \t\n#") != std::string::npos) {
    return ReportError("token create",
                       absl::InvalidArgumentError("--name must not contain spaces or '#'"), err);
  }
  const std::string token = RandomSecret();
  const std::string line = TokenTable::Line(token, token_name_, *role) + "\n";
  if (tokens_file_.empty()) {
    err << line;
  } else {
    const int fd = ::open(tokens_file_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    const bool ok = fd >= 0 &&
                    ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()) &&
                    ::fsync(fd) == 0;
    const int error = errno;
    if (fd >= 0) ::close(fd);
    if (!ok) {
      return ReportError("token create",
                         absl::UnavailableError(
                             absl::StrCat("--tokens-file ", tokens_file_, ": ", strerror(error))),
                         err);
    }
    err << "appended " << token_name_ << " (" << token_role_ << ") to " << tokens_file_
        << "; restart the coordinator to take it\n";
  }
  out << token << "\n";
  return kExitOk;
}

}  // namespace flatshard
