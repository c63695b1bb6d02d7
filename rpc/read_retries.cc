#include "rpc/read_retries.h"

#include <grpc/grpc.h>

namespace flatshard {

const char kReadRetryServiceConfig[] = R"json({
  "methodConfig": [{
    "name": [
      {"service": "flatshard.v1.JobService", "method": "GetJob"},
      {"service": "flatshard.v1.JobService", "method": "ListJobs"},
      {"service": "flatshard.v1.JobService", "method": "ListWorkers"},
      {"service": "flatshard.v1.JobService", "method": "ListCheckpoints"},
      {"service": "flatshard.v1.JobService", "method": "Plan"},
      {"service": "flatshard.v1.JobService", "method": "WatchEvents"}
    ],
    "retryPolicy": {
      "maxAttempts": 4,
      "initialBackoff": "0.1s",
      "maxBackoff": "1s",
      "backoffMultiplier": 2,
      "retryableStatusCodes": ["UNAVAILABLE"]
    }
  }]
})json";

void ApplyReadRetries(grpc::ChannelArguments& args) {
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 1);
  args.SetServiceConfigJSON(kReadRetryServiceConfig);
}

}  // namespace flatshard
