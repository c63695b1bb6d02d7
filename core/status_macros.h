// Early-return helpers for absl::Status / absl::StatusOr, the error currency of
// flatshard. Abseil's own versions are internal, so these are ours.
#ifndef FLATSHARD_CORE_STATUS_MACROS_H_
#define FLATSHARD_CORE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define FLATSHARD_CONCAT_INNER_(a, b) a##b
#define FLATSHARD_CONCAT_(a, b) FLATSHARD_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function if `expr` is not OK.
// NOLINTBEGIN(bugprone-macro-parentheses): `lhs` is a declaration, not an expression.
#define RETURN_IF_ERROR(expr)                              \
  do {                                                     \
    ::absl::Status flatshard_status_ = (expr);             \
    if (!flatshard_status_.ok()) return flatshard_status_; \
  } while (false)

// `ASSIGN_OR_RETURN(auto x, MakeX());` binds the value or returns the error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(FLATSHARD_CONCAT_(flatshard_statusor_, __LINE__), lhs, expr)

#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                           \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(tmp).value()
// NOLINTEND(bugprone-macro-parentheses)

#endif  // FLATSHARD_CORE_STATUS_MACROS_H_
