#include "rpc/keepalive.h"

#include <algorithm>

#include <grpc/grpc.h>

namespace flatshard {
namespace {

int Millis(absl::Duration d) { return static_cast<int>(absl::ToInt64Milliseconds(d)); }

}  // namespace

void ApplyServerKeepalive(grpc::ServerBuilder& builder, absl::Duration interval) {
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             Millis(kServerMinClientPingInterval));
  if (interval <= absl::ZeroDuration()) return;
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, Millis(interval));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                             Millis(std::min(interval, absl::Seconds(20))));
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
