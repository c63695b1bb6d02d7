#include "rpc/keepalive.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include <grpc/grpc.h>

namespace flatshard {
namespace {

// Channel arguments are ints: at least 1 ms, at most ~24.8 days.
int Millis(absl::Duration d) {
  return static_cast<int>(
      std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 1, std::numeric_limits<int>::max()));
}

}  // namespace

void ApplyServerKeepalive(grpc::ServerBuilder& builder, absl::Duration interval) {
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             Millis(kServerMinClientPingInterval));
  if (interval <= absl::ZeroDuration()) return;
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, Millis(interval));
  // At least 5 s to answer, whatever the interval: a loaded peer's transport
  // may take a moment, and dropping a live worker's connection fails its
  // batch.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                             Millis(std::clamp(interval, absl::Seconds(5), absl::Seconds(20))));
  // A stream blocked on a client that reads nothing, or an idle watch,
  // sends no data: without this the pings would stop after two.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
}

void ApplyClientKeepalive(grpc::ChannelArguments& args) {
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, Millis(kClientKeepaliveInterval));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Millis(kClientKeepaliveTimeout));
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
}

}  // namespace flatshard
