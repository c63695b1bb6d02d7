// Who is calling the coordinator, and the audit trail of what they changed.
//
// A call is identified by its bearer token (--tokens-file), else by the
// verified client certificate of a mutual-TLS channel (kAdminIdentity is an
// admin; kWorkerIdentity may register workers). With neither tokens nor a CA
// configured the coordinator is open: every caller is "anonymous" with every
// role, which the listen policy allows on loopback only.
#ifndef FLATSHARD_COORDINATOR_SERVICE_AUTHENTICATOR_H_
#define FLATSHARD_COORDINATOR_SERVICE_AUTHENTICATOR_H_

#include <fstream>
#include <mutex>
#include <optional>
#include <string>

#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "coordinator/service/access_policy.h"
#include "coordinator/service/audit_rate_limit.h"

namespace flatshard {

struct AuthenticatorOptions {
  std::optional<TokenTable> tokens;
  bool mutual_tls = false;     // the server verifies client certificates
  std::string audit_log_path;  // empty: audit lines go to the log only
};

// A caller-chosen value as one audit-line token: C-escaped (no newline or
// quote survives), spaces as '_', at most 256 bytes of it ("..." and the
// full size after), "-" when empty.
std::string AuditField(absl::string_view value);

class Authenticator {
 public:
  // INVALID_ARGUMENT when the audit log cannot be opened for appending.
  static absl::StatusOr<std::unique_ptr<Authenticator>> Create(AuthenticatorOptions options);

  // Neither tokens nor client certificates: no caller is identified.
  bool open() const { return !options_.tokens.has_value() && !options_.mutual_tls; }

  // UNAUTHENTICATED for a missing or unknown token when one is required.
  absl::StatusOr<Principal> Identify(const grpc::ServerContext& context) const;
  // PERMISSION_DENIED naming `call`, the role it needs and the one `who` has.
  absl::Status Permit(const Principal& who, absl::string_view call, Role needed) const;
  // Identify, then Permit.
  absl::StatusOr<Principal> Authorize(const grpc::ServerContext& context, absl::string_view call,
                                      Role needed) const;

  // One line per state-changing call: when, who (name, role, peer), the call,
  // its target and its result. Refusals get a line each up to a burst of
  // kRefusalBurst, then kRefusalsPerSecond, the unidentified
  // (UNAUTHENTICATED) and the identified (PERMISSION_DENIED) each; the next
  // line written after some were not says how many (refusals_not_logged=N).
  void Audit(const grpc::ServerContext& context, const Principal& who, absl::string_view call,
             absl::string_view target, const grpc::Status& result);
  // The line of an admitted streaming call when it starts (result=STARTED):
  // a training or a save may run for hours, and the trail should show it
  // while it runs, not only once it ended. Audit writes its end.
  void AuditStarted(const grpc::ServerContext& context, const Principal& who,
                    absl::string_view call, absl::string_view target);

 private:
  explicit Authenticator(AuthenticatorOptions options) : options_(std::move(options)) {}
  void WriteAudit(const grpc::ServerContext& context, const Principal& who, absl::string_view call,
                  absl::string_view target, absl::string_view result,
                  int64_t refusals_not_logged = 0);

  static constexpr double kRefusalBurst = 100;
  static constexpr double kRefusalsPerSecond = 10;

  AuthenticatorOptions options_;
  AuditRateLimit unidentified_refusals_{kRefusalsPerSecond, kRefusalBurst};  // UNAUTHENTICATED
  AuditRateLimit denials_{kRefusalsPerSecond, kRefusalBurst};                // PERMISSION_DENIED
  std::mutex audit_mu_;
  std::ofstream audit_file_;
};

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_SERVICE_AUTHENTICATOR_H_
