// Who may do what on the coordinator: the roles, the bearer tokens that carry
// them (--tokens-file), and the principal a call runs as.
//
// Tokens file: one token per line, "<sha256-hex> <name> <role>", '#' starts a
// comment. Only the SHA-256 of a token is stored, so the file is not itself a
// credential; `flatshard token create` makes a token and prints its line.
// Roles nest viewer < operator < admin; `worker` is apart: a join token that
// lets a worker daemon register and nothing else.
#ifndef FLATSHARD_COORDINATOR_SERVICE_ACCESS_POLICY_H_
#define FLATSHARD_COORDINATOR_SERVICE_ACCESS_POLICY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace flatshard {

enum class Role { kViewer, kOperator, kAdmin, kWorker };

absl::string_view RoleName(Role role);
// INVALID_ARGUMENT listing the roles for anything else.
absl::StatusOr<Role> ParseRole(absl::string_view name);
// Whether a caller with `have` may make a call that needs `need`.
bool RoleAllows(Role have, Role need);

struct Principal {
  std::string name;  // the token's name, the certificate's CN, or "anonymous"
  Role role = Role::kViewer;
};

class TokenTable {
 public:
  // INVALID_ARGUMENT naming the file and line for a malformed line, an
  // unknown role or a digest listed twice; an unreadable file names the flag.
  static absl::StatusOr<TokenTable> Load(const std::string& path);
  static absl::StatusOr<TokenTable> Parse(absl::string_view text, absl::string_view origin);

  // The principal a presented token stands for; NOT_FOUND for an unknown one.
  // Every entry is compared, in constant time, whatever matches.
  absl::StatusOr<Principal> Find(absl::string_view token) const;
  bool empty() const { return entries_.empty(); }

  // The line that stores `token` for `name` with `role`.
  static std::string Line(absl::string_view token, absl::string_view name, Role role);

 private:
  struct Entry {
    std::string sha256;
    Principal principal;
  };
  std::vector<Entry> entries_;
};

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_SERVICE_ACCESS_POLICY_H_
