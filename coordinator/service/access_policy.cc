#include "coordinator/service/access_policy.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "rpc/secrets.h"

namespace flatshard {

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kViewer:
      return "viewer";
    case Role::kOperator:
      return "operator";
    case Role::kAdmin:
      return "admin";
    case Role::kWorker:
      return "worker";
  }
  return "unknown";
}

absl::StatusOr<Role> ParseRole(absl::string_view name) {
  for (Role role : {Role::kViewer, Role::kOperator, Role::kAdmin, Role::kWorker}) {
    if (name == RoleName(role)) return role;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("role '", name, "' is not one of viewer, operator, admin, worker"));
}

bool RoleAllows(Role have, Role need) {
  if (have == Role::kWorker || need == Role::kWorker) return have == need;
  return static_cast<int>(have) >= static_cast<int>(need);
}

absl::StatusOr<TokenTable> TokenTable::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tokens-file '", path, "' cannot be read (missing or not permitted)"));
  }
  std::stringstream text;
  text << in.rdbuf();
  return Parse(text.str(), absl::StrCat("--tokens-file '", path, "'"));
}

absl::StatusOr<TokenTable> TokenTable::Parse(absl::string_view text, absl::string_view origin) {
  TokenTable table;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    auto bad = [&](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat(origin, " line ", line_number, ": ", what));
    };
    if (fields.size() != 3) return bad("expected '<sha256-hex> <name> <role>'");
    const std::string digest = absl::AsciiStrToLower(fields[0]);
    if (digest.size() != 64 || digest.find_first_not_of("0123456789abcdef") != std::string::npos) {
      return bad("the first field must be a token's SHA-256 as 64 hex digits");
    }
    absl::StatusOr<Role> role = ParseRole(fields[2]);
    if (!role.ok()) return bad(role.status().message());
    for (const Entry& e : table.entries_) {
      if (e.sha256 == digest) return bad(absl::StrCat("the token is listed twice"));
    }
    table.entries_.push_back({digest, Principal{std::string(fields[1]), *role}});
  }
  return table;
}

absl::StatusOr<Principal> TokenTable::Find(absl::string_view token) const {
  const std::string digest = Sha256Hex(token);
  const Principal* found = nullptr;
  for (const Entry& e : entries_) {
    if (ConstantTimeEquals(e.sha256, digest)) found = &e.principal;
  }
  if (found == nullptr) return absl::NotFoundError("unknown token");
  return *found;
}

std::string TokenTable::Line(absl::string_view token, absl::string_view name, Role role) {
  return absl::StrCat(Sha256Hex(token), " ", name, " ", RoleName(role));
}

}  // namespace flatshard
