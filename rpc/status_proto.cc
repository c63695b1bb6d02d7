#include "rpc/status_proto.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace flatshard {

v1::Status StatusToProto(const absl::Status& status) {
  v1::Status proto;
  proto.set_code(static_cast<int>(status.code()));
  proto.set_message(std::string(status.message()));
  return proto;
}

absl::Status StatusFromProto(const v1::Status& status) {
  if (status.code() == 0) return absl::OkStatus();
  constexpr int kLastCode = static_cast<int>(absl::StatusCode::kUnauthenticated);
  if (status.code() < 0 || status.code() > kLastCode) {
    return absl::UnknownError(absl::StrCat("(status code ", status.code(), ") ", status.message()));
  }
  return absl::Status(static_cast<absl::StatusCode>(status.code()), status.message());
}

}  // namespace flatshard
