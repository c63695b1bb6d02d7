#include "coordinator/service/authenticator.h"

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "rpc/call_metadata.h"
#include "rpc/tls_credentials.h"
#include "spdlog/spdlog.h"

namespace flatshard {

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(AuthenticatorOptions options) {
  std::unique_ptr<Authenticator> auth(new Authenticator(std::move(options)));
  if (!auth->options_.audit_log_path.empty()) {
    auth->audit_file_.open(auth->options_.audit_log_path, std::ios::app);
    if (!auth->audit_file_) {
      return absl::InvalidArgumentError(absl::StrCat("--audit-log '", auth->options_.audit_log_path,
                                                     "' cannot be opened for appending"));
    }
  }
  return auth;
}

absl::StatusOr<Principal> Authenticator::Identify(const grpc::ServerContext& context) const {
  if (open()) return Principal{"anonymous", Role::kAdmin};
  const std::string token = BearerToken(context);
  if (!token.empty() && options_.tokens.has_value()) {
    absl::StatusOr<Principal> found = options_.tokens->Find(token);
    if (!found.ok()) {
      return absl::UnauthenticatedError(
          "the bearer token is not in the coordinator's --tokens-file");
    }
    return found;
  }
  if (options_.mutual_tls) {
    const std::string name = PeerCommonName(context);
    if (name == kAdminIdentity) return Principal{name, Role::kAdmin};
    if (name == kWorkerIdentity) return Principal{name, Role::kWorker};
  }
  return absl::UnauthenticatedError(
      "no credentials: give a token (--token, FLATSHARD_TOKEN or --token-file) or an admin "
      "client certificate");
}

absl::StatusOr<Principal> Authenticator::Authorize(const grpc::ServerContext& context,
                                                   absl::string_view call, Role needed) const {
  absl::StatusOr<Principal> who = Identify(context);
  if (!who.ok()) return who.status();
  if (absl::Status permitted = Permit(*who, call, needed); !permitted.ok()) return permitted;
  return who;
}

absl::Status Authenticator::Permit(const Principal& who, absl::string_view call,
                                   Role needed) const {
  // Open: every caller may do everything (loopback development).
  if (open() || RoleAllows(who.role, needed)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(call, " needs role ", RoleName(needed), "; '",
                                                  who.name, "' has role ", RoleName(who.role)));
}

std::string AuditField(absl::string_view value) {
  // Callers choose these bytes (even unidentified ones, whose refusals are
  // audited too): escaped, so a newline cannot forge a line, and capped, so
  // an 8 MiB job name cannot fill the disk one refused call at a time.
  constexpr size_t kMaxAuditFieldBytes = 256;
  if (value.empty()) return "-";
  const bool cut = value.size() > kMaxAuditFieldBytes;
  std::string field = absl::CHexEscape(value.substr(0, kMaxAuditFieldBytes));
  for (char& c : field) {
    if (c == ' ') c = '_';  // one token per field: name=value pairs split on spaces
  }
  if (cut) absl::StrAppend(&field, "...(", value.size(), " bytes)");
  return field;
}

void Authenticator::Audit(const grpc::ServerContext& context, const Principal& who,
                          absl::string_view call, absl::string_view target,
                          const grpc::Status& result) {
  const auto code = static_cast<absl::StatusCode>(result.error_code());
  // Callers that proved no identity and those that did have a budget each,
  // so a flood of the first does not hide the refusals of the second.
  int64_t not_logged = 0;
  if (code == absl::StatusCode::kUnauthenticated || code == absl::StatusCode::kPermissionDenied) {
    AuditRateLimit& budget =
        code == absl::StatusCode::kUnauthenticated ? unidentified_refusals_ : denials_;
    const std::optional<int64_t> admitted = budget.Admit(absl::Now());
    if (!admitted.has_value()) return;
    not_logged = *admitted;
  }
  // Any line says what went unwritten, so a flood that stopped is counted.
  not_logged += unidentified_refusals_.TakeNotWritten() + denials_.TakeNotWritten();
  WriteAudit(context, who, call, target, absl::StatusCodeToString(code), not_logged);
}

void Authenticator::AuditStarted(const grpc::ServerContext& context, const Principal& who,
                                 absl::string_view call, absl::string_view target) {
  WriteAudit(context, who, call, target, "STARTED",
             unidentified_refusals_.TakeNotWritten() + denials_.TakeNotWritten());
}

void Authenticator::WriteAudit(const grpc::ServerContext& context, const Principal& who,
                               absl::string_view call, absl::string_view target,
                               absl::string_view result, int64_t refusals_not_logged) {
  std::string line = absl::StrCat(
      "audit time=", absl::FormatTime(absl::RFC3339_full, absl::Now(), absl::UTCTimeZone()),
      " who=", who.name, " role=", RoleName(who.role), " peer=", context.peer(), " call=", call,
      " target=", AuditField(target), " result=", result);
  if (refusals_not_logged > 0) absl::StrAppend(&line, " refusals_not_logged=", refusals_not_logged);
  spdlog::info("{}", line);
  if (audit_file_.is_open()) {
    std::lock_guard<std::mutex> lock(audit_mu_);
    audit_file_ << line << std::endl;  // flushed: an audit trail survives a crash
  }
}

}  // namespace flatshard
