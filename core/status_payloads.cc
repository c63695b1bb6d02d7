#include "core/status_payloads.h"

#include <string>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace flatshard {
namespace {

constexpr absl::string_view kFailedRankUrl = "type.flatshard.dev/flatshard.FailedRank";
constexpr absl::string_view kUnreachablePeerUrl = "type.flatshard.dev/flatshard.UnreachablePeer";

absl::Status WithRank(absl::Status status, absl::string_view url, int rank) {
  if (!status.ok() && rank >= 0) status.SetPayload(url, absl::Cord(absl::StrCat(rank)));
  return status;
}

std::optional<int> RankOf(const absl::Status& status, absl::string_view url) {
  const auto payload = status.GetPayload(url);  // absl::optional<absl::Cord>
  int rank = -1;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &rank) || rank < 0) {
    return std::nullopt;
  }
  return rank;
}

}  // namespace

absl::Status WithFailedRank(absl::Status status, int rank) {
  return WithRank(std::move(status), kFailedRankUrl, rank);
}

std::optional<int> FailedRank(const absl::Status& status) { return RankOf(status, kFailedRankUrl); }

absl::Status WithUnreachablePeer(absl::Status status, int peer) {
  return WithRank(std::move(status), kUnreachablePeerUrl, peer);
}

std::optional<int> UnreachablePeer(const absl::Status& status) {
  return RankOf(status, kUnreachablePeerUrl);
}

absl::Status PrefixStatus(absl::string_view prefix, const absl::Status& status) {
  if (status.ok()) return status;
  absl::Status prefixed(status.code(), absl::StrCat(prefix, status.message()));
  status.ForEachPayload(
      [&](absl::string_view url, const absl::Cord& payload) { prefixed.SetPayload(url, payload); });
  return prefixed;
}

}  // namespace flatshard
