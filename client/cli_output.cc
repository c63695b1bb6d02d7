#include "client/cli_output.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/util/json_util.h"
#include "rpc/tls_flags.h"

namespace flatshard {

int ExitCodeFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return kExitOk;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kResourceExhausted:
      return kExitRefused;
    case absl::StatusCode::kUnavailable:
      return absl::StartsWith(status.message(), "no coordinator at") ? kExitUnreachable
                                                                     : kExitFailed;
    default:
      return kExitFailed;
  }
}

int ReportError(const std::string& command, const absl::Status& status, std::ostream& err) {
  err << "flatshard " << command << ": " << status.message() << "\n";
  return ExitCodeFor(status);
}

void PrintTable(const std::vector<std::string>& header,
                const std::vector<std::vector<std::string>>& rows, std::ostream& out) {
  std::vector<size_t> width(header.size(), 0);
  for (size_t c = 0; c < header.size(); ++c) width[c] = header[c].size();
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size() && c < width.size(); ++c) {
      width[c] = std::max(width[c], row[c].size());
    }
  }
  auto print = [&](const std::vector<std::string>& cells) {
    std::string line;
    for (size_t c = 0; c < cells.size(); ++c) {
      line += cells[c];
      if (c + 1 < cells.size()) line.append(width[c] - cells[c].size() + 2, ' ');
    }
    out << line << "\n";
  };
  print(header);
  for (const auto& row : rows) print(row);
}

std::string FormatSeconds(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  if (seconds < 60) return absl::StrFormat("%.1fs", seconds);
  const int64_t total = std::llround(seconds);
  if (total < 3600) return absl::StrFormat("%dm%02ds", total / 60, total % 60);
  return absl::StrFormat("%dh%02dm", total / 3600, (total % 3600) / 60);
}

}  // namespace flatshard

namespace flatshard {

std::string FormatMillis(double seconds) {
  if (seconds < 1.0) return absl::StrFormat("%.0fms", seconds * 1e3);
  return FormatSeconds(seconds);
}

void AddCoordinatorOption(CLI::App* command, CoordinatorTarget& coordinator) {
  command
      ->add_option("--coordinator,-c", coordinator.address,
                   "Coordinator address (env FLATSHARD_COORDINATOR)")
      ->envname("FLATSHARD_COORDINATOR")
      ->capture_default_str();
  AddTlsFlags(*command, coordinator.tls, "the coordinator");
  command
      ->add_option("--token", coordinator.token,
                   "Bearer token for the coordinator's --tokens-file (env FLATSHARD_TOKEN)")
      ->envname("FLATSHARD_TOKEN");
  command
      ->add_option("--token-file", coordinator.token_file,
                   "File whose first line is the token (env FLATSHARD_TOKEN_FILE; `flatshard up "
                   "--tls` writes one)")
      ->envname("FLATSHARD_TOKEN_FILE");
}

void AddJobOption(CLI::App* command, std::string& job) {
  command->add_option("--job,-j", job, "Job name (env FLATSHARD_JOB)")
      ->envname("FLATSHARD_JOB")
      ->required();
}

std::string MessageToJson(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  return json;
}

}  // namespace flatshard
