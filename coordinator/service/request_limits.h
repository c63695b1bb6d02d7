// Limits that keep one client from exhausting the coordinator: concurrent
// streaming calls per client, and a token-bucket rate on the expensive calls
// (Plan, SummonFullParams, SaveCheckpoint). Each refusal is
// RESOURCE_EXHAUSTED naming the limit, its value and the flag that sets it.
#ifndef FLATSHARD_COORDINATOR_SERVICE_REQUEST_LIMITS_H_
#define FLATSHARD_COORDINATOR_SERVICE_REQUEST_LIMITS_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace flatshard {

struct RequestLimitSettings {
  int max_streams_per_client = 32;      // --max-streams-per-client
  int expensive_calls_per_minute = 60;  // --expensive-calls-per-minute (also the burst)
};

class RequestLimits {
 public:
  explicit RequestLimits(RequestLimitSettings settings) : settings_(settings) {}

  // Held for the life of a streaming call; releases its slot when destroyed.
  class StreamSlot {
   public:
    StreamSlot(RequestLimits* limits, std::string client)
        : limits_(limits), client_(std::move(client)) {}
    StreamSlot(StreamSlot&& other) noexcept
        : limits_(std::exchange(other.limits_, nullptr)), client_(std::move(other.client_)) {}
    StreamSlot& operator=(StreamSlot&&) = delete;
    ~StreamSlot();

   private:
    RequestLimits* limits_;
    std::string client_;
  };

  absl::StatusOr<StreamSlot> AdmitStream(const std::string& client, absl::string_view call);
  absl::Status AdmitExpensive(const std::string& client, absl::string_view call, absl::Time now);

 private:
  struct Bucket {
    double tokens = 0;
    absl::Time refilled;
  };
  const RequestLimitSettings settings_;
  std::mutex mu_;
  std::map<std::string, int> streams_;
  std::map<std::string, Bucket> buckets_;
};

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_SERVICE_REQUEST_LIMITS_H_
