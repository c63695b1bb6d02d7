#include "proto/grpc_status.h"

#include <cstdint>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"

#include "flatshard/v1/common.pb.h"

namespace flatshard {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  v1::StatusDetails details;
  details.set_code(static_cast<int32_t>(status.code()));
  details.set_message(std::string(status.message()));
  status.ForEachPayload([&details](absl::string_view type_url, const absl::Cord& value) {
    v1::StatusPayload* payload = details.add_payloads();
    payload->set_type_url(std::string(type_url));
    payload->set_value(std::string(value));
  });
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()),
                      details.payloads().empty() ? std::string() : details.SerializeAsString());
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  absl::Status converted(static_cast<absl::StatusCode>(status.error_code()),
                         status.error_message());
  v1::StatusDetails details;
  if (!status.error_details().empty() && details.ParseFromString(status.error_details())) {
    for (const v1::StatusPayload& payload : details.payloads()) {
      converted.SetPayload(payload.type_url(), absl::Cord(payload.value()));
    }
  }
  return converted;
}

}  // namespace flatshard
