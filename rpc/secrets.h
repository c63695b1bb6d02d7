// Secrets flatshard puts on the wire: bearer tokens, worker identity secrets,
// registration sessions and the per-worker command token. Each is 32 random
// bytes from OpenSSL's CSPRNG, written as 64 hex digits; servers keep only
// SHA-256 digests of the long-lived ones and compare in constant time.
#ifndef FLATSHARD_RPC_SECRETS_H_
#define FLATSHARD_RPC_SECRETS_H_

#include <string>

#include "absl/strings/string_view.h"

namespace flatshard {

// 64 hex digits of fresh randomness. Aborts if the CSPRNG cannot be seeded:
// a predictable secret is worse than no process.
std::string RandomSecret();

// SHA-256 of `text`, as 64 lowercase hex digits.
std::string Sha256Hex(absl::string_view text);

// Equality whose time does not depend on where the inputs differ (only on
// their lengths, which are public: every secret and digest is 64 digits).
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace flatshard

#endif  // FLATSHARD_RPC_SECRETS_H_
