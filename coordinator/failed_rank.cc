#include "coordinator/failed_rank.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace flatshard {
namespace {

constexpr absl::string_view kFailedRankUrl = "type.flatshard.dev/flatshard.FailedRank";

}  // namespace

absl::Status WithFailedRank(absl::Status status, int rank) {
  if (!status.ok() && rank >= 0) status.SetPayload(kFailedRankUrl, absl::Cord(absl::StrCat(rank)));
  return status;
}

std::optional<int> FailedRank(const absl::Status& status) {
  const auto payload = status.GetPayload(kFailedRankUrl);  // absl::optional<absl::Cord>
  int rank = -1;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &rank) || rank < 0) {
    return std::nullopt;
  }
  return rank;
}

absl::Status PrefixStatus(absl::string_view prefix, const absl::Status& status) {
  if (status.ok()) return status;
  absl::Status prefixed(status.code(), absl::StrCat(prefix, status.message()));
  status.ForEachPayload(
      [&](absl::string_view url, const absl::Cord& payload) { prefixed.SetPayload(url, payload); });
  return prefixed;
}

}  // namespace flatshard
