// WorkerClient over gRPC: every call but rank 0's Summon (whose chunks go to
// a blocking sink) uses the callback API, so fanning a configure, a step, a
// probe, an abort or a summon out to W workers, or awaiting W async writes,
// holds no thread per worker.
#ifndef FLATSHARD_COORDINATOR_GRPC_WORKER_CLIENT_H_
#define FLATSHARD_COORDINATOR_GRPC_WORKER_CLIENT_H_

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/security/credentials.h>

#include "absl/time/time.h"

#include "coordinator/worker_client.h"
#include "flatshard/v1/worker.grpc.pb.h"

namespace flatshard {

// A second after its last call, a worker's channel lets its connection go
// and stops reconnecting (a recovery's probe that finds a worker gone lets
// its channel go at once: WorkerClient::Disconnect). Left busy, a channel
// to a worker that died redials its address every backoff for the client's
// life; the kernel hands that freed port to the next socket bound on the
// host (a survivor's Gloo pair listener), and a dial then takes the one
// accept that pair waits for from its peer. A call after the idle time
// reconnects first (a handshake).
inline constexpr absl::Duration kWorkerChannelIdle = absl::Seconds(1);

// The idle time for a channel to one of `world_size` ranks: the second, plus
// the longest a fan-out to all of them may take (FanOutTimeout, connecting).
// A fan-out to 16,384 workers takes seconds (33.8 s of idle time there),
// and a channel answered early in one must still be connected for the next;
// with a fixed second, probes at that scale reconnected the channels answered
// first, and one took 37 s where the others took 9 (bench/RESULTS.md,
// 2026-12-01). A dead worker's channel redials for this long at most after
// the coordinator's last call.
absl::Duration WorkerChannelIdle(size_t world_size);

class GrpcWorkerClient final : public WorkerClient {
 public:
  // `credentials` null: plaintext. `command_token`: what the worker sent in its
  // registration; every call carries it. `idle_timeout`: WorkerChannelIdle.
  explicit GrpcWorkerClient(const std::string& address,
                            const std::shared_ptr<grpc::ChannelCredentials>& credentials = nullptr,
                            std::string command_token = "",
                            absl::Duration idle_timeout = kWorkerChannelIdle);
  ~GrpcWorkerClient() override;

  void Execute(const v1::CommandBatch* batch, absl::Time deadline, ExecuteDone done) override;
  void CancelAll() override;
  void ConfigureAsync(v1::ConfigureRequest request, absl::Time connect_by, absl::Time deadline,
                      ConfigureDone done) override;
  void AwaitSave(const std::string& directory, absl::Time deadline, AwaitSaveDone done) override;
  void GetStatusAsync(absl::Time deadline, GetStatusDone done) override;
  void AbortAsync(uint64_t epoch, const std::string& reason, absl::Time deadline,
                  AbortDone done) override;
  absl::Status Summon(const v1::CommandBatch& batch, absl::Time deadline,
                      const ChunkSink& sink) override;
  void JoinSummonAsync(const v1::CommandBatch* batch, absl::Time deadline,
                       JoinSummonDone done) override;
  void Disconnect() override;
  std::string address() const override { return address_; }

 private:
  // A callback call: its context (for CancelAll, when `cancellable`),
  // request, response and `done`. Owned here, never by its callback, and
  // freed while this client still holds the channel (at a later Start, in
  // Disconnect, or in the destructor, before the channel goes): its context
  // holds a reference to the channel, and gRPC 1.51 must not drop a
  // channel's last reference on a thread of its process-wide callback queue
  // (the queue is then shut down from its own thread, which cannot join
  // itself, and the process aborts soon after; grpc/grpc pull request 32584
  // describes it, and worker_client_async_test caught it here). `done`
  // lives here too, so nothing it captures is released by gRPC on that
  // thread either.
  struct Call {
    virtual ~Call() = default;
    grpc::ClientContext context;
    bool cancellable = true;
    int holders = 2;  // Start and the callback; guarded by mu_
  };
  // A callback call with one answer. For a joined summon, whose stream
  // should bring nothing, `request` is the reader of that stream.
  template <typename Request, typename Response>
  struct UnaryCall : Call {
    Request request;  // std::nullptr_t for Execute, whose batch is the caller's
    Response response;
    std::function<void(absl::StatusOr<Response>)> done;
  };
  // Starts the stub's callback method on the context, with the callback.
  using StartFn = std::function<void(grpc::ClientContext*, std::function<void(grpc::Status)>)>;

  // Registers `call` (its deadline and token set), starts it with `start`,
  // and runs `done` with `call`'s response or the call's error; the call is
  // then kept among the finished, which the next Start or the destructor
  // destroys. With `cancellations_seen`, a CancelAll since that count was
  // read cancels the call before it starts (a call chained after another,
  // which CancelAll could not reach in between).
  template <typename Request, typename Response>
  void Start(std::unique_ptr<UnaryCall<Request, Response>> call, absl::Time deadline,
             const StartFn& start, std::function<void(absl::StatusOr<Response>)> done,
             std::optional<uint64_t> cancellations_seen = std::nullopt);

  // The error of a call refused after Disconnect.
  absl::Status DisconnectedError() const;
  // One of a call's two holders is done with it; the last one moves it
  // from the in-flight calls to the finished.
  void ReleaseLocked(const Call* call);

  std::string address_;
  const std::string command_token_;
  // Both null once Disconnect has run; a call reads them only while it is
  // in flight, which Disconnect waits out before it lets them go.
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  std::mutex mu_;
  std::condition_variable idle_;  // no call in flight, no blocking call
  bool disconnected_ = false;     // guarded by mu_
  std::map<const Call*, std::unique_ptr<Call>> in_flight_;
  std::vector<std::unique_ptr<Call>> finished_;  // answered, not destroyed yet
  // Contexts of blocking calls, so CancelAll reaches them too.
  std::set<grpc::ClientContext*> blocking_;
  // Counts CancelAll calls: a configure between its connect probe and its
  // Configure call has nothing in flight to cancel, and Start reads this.
  uint64_t cancellations_ = 0;
};

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_GRPC_WORKER_CLIENT_H_
