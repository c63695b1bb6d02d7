// HTTP/2 keepalive for every flatshard server and channel, set in one place so
// that both ends agree. Without it a peer that vanishes (a host that lost
// power or its network, a process stopped with SIGSTOP) is noticed only when
// TCP gives up on data in flight, minutes later, or never on an idle stream:
// a server would keep a WatchEvents or Train stream, its thread and its
// client's stream slot for good. Keepalive pings are answered by the peer's
// gRPC transport, not its application, so they say nothing of a client that
// is alive but not reading (coordinator/service/stalled_write_guard.h).
#ifndef FLATSHARD_RPC_KEEPALIVE_H_
#define FLATSHARD_RPC_KEEPALIVE_H_

#include <grpcpp/server_builder.h>
#include <grpcpp/support/channel_arguments.h>

#include "absl/time/time.h"

namespace flatshard {

// How often a client pings a server it has calls in flight to (after this
// long without other traffic), and how long it waits for the answer.
inline constexpr absl::Duration kClientKeepaliveInterval = absl::Seconds(30);
inline constexpr absl::Duration kClientKeepaliveTimeout = absl::Seconds(10);
// Client pings a server accepts as often as this; more frequent ones are
// "ping strikes" that make it close the connection (gRPC's policing), so it
// must stay below kClientKeepaliveInterval.
inline constexpr absl::Duration kServerMinClientPingInterval = absl::Seconds(10);
// The servers' default interval (the coordinator's --keepalive-interval).
inline constexpr absl::Duration kServerKeepaliveInterval = absl::Seconds(30);

// A server pings each connection that has calls in flight after `interval`
// without traffic, and drops it (cancelling its calls) when a ping is not
// answered within `interval` clamped to [5 s, 20 s]. `interval` <= 0: no
// server pings.
void ApplyServerKeepalive(grpc::ServerBuilder& builder, absl::Duration interval);

// A client channel pings as above (kClientKeepaliveInterval / Timeout).
void ApplyClientKeepalive(grpc::ChannelArguments& args);

}  // namespace flatshard

#endif  // FLATSHARD_RPC_KEEPALIVE_H_
