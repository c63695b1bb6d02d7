// The read-only JobService calls (GetJob, ListJobs, ListWorkers,
// ListCheckpoints, Plan, and the WatchEvents stream, which gRPC retries only
// before its first event arrives) are retried by the client's channel when
// they fail UNAVAILABLE: a client that outlived a coordinator restart otherwise fails
// its first call on the dead connection ("Socket closed"), and a coordinator
// restarting under a dashboard or a notebook is what these calls meet most.
// Calls that change anything are never retried here: whether they ran is for
// their caller to find out (docs/control-plane.md).
#ifndef FLATSHARD_RPC_READ_RETRIES_H_
#define FLATSHARD_RPC_READ_RETRIES_H_

#include <grpcpp/support/channel_arguments.h>

namespace flatshard {

// The channel's service config: 4 attempts, backoff 0.1 s doubling to 1 s.
// client/python/flatshard/cluster.py carries the same JSON.
extern const char kReadRetryServiceConfig[];

void ApplyReadRetries(grpc::ChannelArguments& args);

}  // namespace flatshard

#endif  // FLATSHARD_RPC_READ_RETRIES_H_
