#include "coordinator/grpc_worker_client.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>
#include <grpcpp/support/client_callback.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "rpc/call_metadata.h"
#include "rpc/keepalive.h"

#include "coordinator/worker_fan_out.h"
#include "proto/grpc_status.h"

namespace flatshard {
namespace {

constexpr int kMaxMessageBytes = 64 << 20;

// The command token, when there is one: a worker without one accepts a call
// without the header (MetadataValue reads it as empty), so an insecure
// cluster's calls carry none.
void AttachCommandToken(grpc::ClientContext& context, const std::string& token) {
  if (!token.empty()) context.AddMetadata(kCommandTokenKey, token);
}

// Registers a blocking call's context for CancelAll and Disconnect while it
// runs; refused (registering nothing) once the client is disconnected.
class BlockingCall {
 public:
  BlockingCall(std::mutex& mu, std::condition_variable& idle, std::set<grpc::ClientContext*>& set,
               const bool& disconnected, absl::Time deadline, const std::string& command_token)
      : mu_(mu), idle_(idle), set_(set) {
    context_.set_deadline(absl::ToChronoTime(deadline));
    AttachCommandToken(context_, command_token);
    std::lock_guard<std::mutex> lock(mu_);
    refused_ = disconnected;
    if (!refused_) set_.insert(&context_);
  }
  ~BlockingCall() {
    std::lock_guard<std::mutex> lock(mu_);
    if (refused_) return;
    set_.erase(&context_);
    idle_.notify_all();
  }
  BlockingCall(const BlockingCall&) = delete;
  BlockingCall& operator=(const BlockingCall&) = delete;
  grpc::ClientContext* context() { return &context_; }
  bool refused() const { return refused_; }

 private:
  std::mutex& mu_;
  std::condition_variable& idle_;
  std::set<grpc::ClientContext*>& set_;
  grpc::ClientContext context_;
  bool refused_ = false;
};

// Reads a joined summon's stream (JoinSummonAsync), which should end with
// the worker's status and no chunk: a chunk cancels the call and is its
// error. gRPC runs OnDone last, after any OnReadDone.
class JoinedSummonReader final : public grpc::ClientReadReactor<v1::TensorChunk> {
 public:
  // Starts the call; `finished` runs once, from OnDone, with its outcome.
  void Begin(v1::WorkerService::Stub* stub, grpc::ClientContext* context,
             const v1::CommandBatch* batch, std::string address,
             std::function<void(grpc::Status)> finished) {
    context_ = context;
    address_ = std::move(address);
    finished_ = std::move(finished);
    stub->async()->Summon(context, batch, this);
    StartRead(&chunk_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended: OnDone brings its status
    streamed_.store(true);
    context_->TryCancel();
  }
  void OnDone(const grpc::Status& status) override {
    // A local: `finished` may end in this reader's destruction (the call it
    // belongs to is then finished, and another thread's Start frees it).
    std::function<void(grpc::Status)> finished = std::move(finished_);
    if (streamed_.load()) {
      finished(grpc::Status(grpc::StatusCode::INTERNAL,
                            absl::StrCat(address_, " streamed parameters to a summon it only ",
                                         "joins (only rank 0 streams)")));
    } else {
      finished(status);
    }
  }

 private:
  grpc::ClientContext* context_ = nullptr;
  std::string address_;
  std::function<void(grpc::Status)> finished_;
  v1::TensorChunk chunk_;
  // Written in OnReadDone, read in OnDone: ordered by gRPC, whose own
  // synchronization ThreadSanitizer does not see.
  std::atomic<bool> streamed_{false};
};

}  // namespace

absl::Duration WorkerChannelIdle(size_t world_size) {
  return FanOutTimeout(kWorkerChannelIdle, world_size, FanOutChannels::kConnecting);
}

GrpcWorkerClient::GrpcWorkerClient(const std::string& address,
                                   const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                                   std::string command_token, absl::Duration idle_timeout)
    : address_(address), command_token_(std::move(command_token)) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  // Reconnect within the connect grace (gRPC's default first backoff is 1 s).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Despite its name, the least time one connection attempt is given to
  // finish its handshake (gRPC's MIN_CONNECT_TIMEOUT, doc/connection-
  // backoff.md: an attempt's deadline is the later of the next backoff and
  // this). It was set to 100 ms with the backoff above: a handshake slower
  // than that, or than the backoff, was abandoned and redone, which a
  // coordinator connecting to thousands of workers at once, or one
  // symbolizing a ThreadSanitizer report, is. gRPC's default, kept.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 20000);
  // kWorkerChannelIdle says why a channel idles at all.
  args.SetInt(GRPC_ARG_CLIENT_IDLE_TIMEOUT_MS,
              static_cast<int>(absl::ToInt64Milliseconds(idle_timeout)));
  ApplyClientKeepalive(args);
  channel_ = grpc::CreateCustomChannel(
      address, credentials != nullptr ? credentials : grpc::InsecureChannelCredentials(), args);
  stub_ = v1::WorkerService::NewStub(channel_);
}

GrpcWorkerClient::~GrpcWorkerClient() {
  CancelAll();
  // Callbacks reference this object: wait until the last one has run.
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [this] { return in_flight_.empty(); });
  // The calls' contexts go here, before the channel they reference.
  finished_.clear();
}

template <typename Request, typename Response>
void GrpcWorkerClient::Start(std::unique_ptr<UnaryCall<Request, Response>> call,
                             absl::Time deadline, const StartFn& start,
                             std::function<void(absl::StatusOr<Response>)> done,
                             std::optional<uint64_t> cancellations_seen) {
  UnaryCall<Request, Response>* const started = call.get();
  started->done = std::move(done);
  started->context.set_deadline(absl::ToChronoTime(deadline));
  AttachCommandToken(started->context, command_token_);
  std::vector<std::unique_ptr<Call>> spent;
  // Cancelled or disconnected before it started: its context holds no
  // channel, so it may go on any thread.
  std::unique_ptr<Call> refused;
  absl::Status refusal;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (disconnected_) {
      refused = std::move(call);
      refusal = DisconnectedError();
    } else if (cancellations_seen.has_value() && *cancellations_seen != cancellations_) {
      refused = std::move(call);
      refusal = absl::CancelledError("cancelled before it was sent");
    } else {
      spent.swap(finished_);
      in_flight_.emplace(started, std::move(call));
    }
  }
  spent.clear();  // here, while this client holds the channel
  if (refused != nullptr) {
    started->done(std::move(refusal));
    return;
  }
  // The callback captures no owner of anything: gRPC destroys it on its
  // own thread.
  start(&started->context, [this, started = started](const grpc::Status& status) {
    if (status.ok()) {
      started->done(std::move(started->response));
    } else {
      started->done(FromGrpcStatus(status));
    }
    std::lock_guard<std::mutex> lock(mu_);
    ReleaseLocked(started);
  });
  // The answer can come (and another thread's Start sweep the finished)
  // while `start` is still reading the context: the call is finished only
  // when both its callback and `start` are done with it.
  std::lock_guard<std::mutex> lock(mu_);
  ReleaseLocked(started);
}

void GrpcWorkerClient::ReleaseLocked(const Call* call) {
  const auto it = in_flight_.find(call);
  if (--it->second->holders > 0) return;
  finished_.push_back(std::move(it->second));
  in_flight_.erase(it);
  if (in_flight_.empty()) idle_.notify_all();
}

void GrpcWorkerClient::Execute(const v1::CommandBatch* batch, absl::Time deadline,
                               ExecuteDone done) {
  auto call = std::make_unique<UnaryCall<std::nullptr_t, v1::CommandResult>>();
  v1::CommandResult* const response = &call->response;
  Start<std::nullptr_t, v1::CommandResult>(
      std::move(call), deadline,
      [&](grpc::ClientContext* context, std::function<void(grpc::Status)> callback) {
        stub_->async()->Execute(context, batch, response, std::move(callback));
      },
      std::move(done));
}

void GrpcWorkerClient::AwaitSave(const std::string& directory, absl::Time deadline,
                                 AwaitSaveDone done) {
  auto call = std::make_unique<UnaryCall<v1::AwaitSaveRequest, v1::CommandResult>>();
  call->request.set_directory(directory);
  UnaryCall<v1::AwaitSaveRequest, v1::CommandResult>* const started = call.get();
  Start<v1::AwaitSaveRequest, v1::CommandResult>(
      std::move(call), deadline,
      [&](grpc::ClientContext* context, std::function<void(grpc::Status)> callback) {
        stub_->async()->AwaitSave(context, &started->request, &started->response,
                                  std::move(callback));
      },
      std::move(done));
}

void GrpcWorkerClient::GetStatusAsync(absl::Time deadline, GetStatusDone done) {
  auto call = std::make_unique<UnaryCall<v1::GetStatusRequest, v1::GetStatusResponse>>();
  call->cancellable = false;  // as the blocking GetStatus: a probe is how failures are seen
  UnaryCall<v1::GetStatusRequest, v1::GetStatusResponse>* const started = call.get();
  Start<v1::GetStatusRequest, v1::GetStatusResponse>(
      std::move(call), deadline,
      [&](grpc::ClientContext* context, std::function<void(grpc::Status)> callback) {
        stub_->async()->GetStatus(context, &started->request, &started->response,
                                  std::move(callback));
      },
      std::move(done));
}

void GrpcWorkerClient::AbortAsync(uint64_t epoch, const std::string& reason, absl::Time deadline,
                                  AbortDone done) {
  auto call = std::make_unique<UnaryCall<v1::AbortRequest, v1::AbortResponse>>();
  call->cancellable = false;  // it is how failures end
  call->request.set_reason(reason);
  call->request.set_job_epoch(epoch);
  UnaryCall<v1::AbortRequest, v1::AbortResponse>* const started = call.get();
  Start<v1::AbortRequest, v1::AbortResponse>(
      std::move(call), deadline,
      [&](grpc::ClientContext* context, std::function<void(grpc::Status)> callback) {
        stub_->async()->Abort(context, &started->request, &started->response, std::move(callback));
      },
      [done = std::move(done)](const absl::StatusOr<v1::AbortResponse>& answer) {
        done(answer.status());
      });
}

void GrpcWorkerClient::CancelAll() {
  std::lock_guard<std::mutex> lock(mu_);
  ++cancellations_;
  for (const auto& [key, call] : in_flight_) {
    if (call->cancellable) call->context.TryCancel();
  }
  for (grpc::ClientContext* context : blocking_) context->TryCancel();
}

void GrpcWorkerClient::Disconnect() {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::WorkerService::Stub> stub;
  std::vector<std::unique_ptr<Call>> spent;
  {
    std::unique_lock<std::mutex> lock(mu_);
    const bool first = !disconnected_;
    disconnected_ = true;  // from here on no call starts
    ++cancellations_;
    // Probes and aborts too: nothing this worker could answer matters now.
    for (const auto& [key, call] : in_flight_) call->context.TryCancel();
    for (grpc::ClientContext* context : blocking_) context->TryCancel();
    // A second caller returns once the callbacks have run, too.
    idle_.wait(lock, [this] { return in_flight_.empty() && blocking_.empty(); });
    if (!first) return;
    spent.swap(finished_);
    stub = std::move(stub_);
    channel = std::move(channel_);
  }
  // The calls' contexts first (each holds the channel), then the stub and
  // the channel: the last reference goes here, on this thread (the Call
  // comment in the header says why that matters), and with it the channel's
  // connection and its reconnection timer.
  spent.clear();
  stub.reset();
  channel.reset();
}

absl::Status GrpcWorkerClient::DisconnectedError() const {
  return absl::UnavailableError(
      absl::StrCat(address_, " was disconnected: the coordinator gave this worker up"));
}

void GrpcWorkerClient::ConfigureAsync(v1::ConfigureRequest request, absl::Time connect_by,
                                      absl::Time deadline, ConfigureDone done) {
  // The connect grace, without a thread waiting on the channel: a GetStatus
  // that waits for the channel to be ready (not fail-fast) for as long as the
  // grace. Any answer, even a refusal, means the worker's server is there;
  // Configure's own answer then says the rest.
  const absl::Time now = absl::Now();
  connect_by = std::min(deadline, connect_by);
  uint64_t cancellations = 0;
  bool disconnected = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancellations = cancellations_;
    disconnected = disconnected_;
  }
  if (disconnected) {  // not "cannot connect": nothing was tried
    done(DisconnectedError());
    return;
  }
  auto probe = std::make_unique<UnaryCall<v1::GetStatusRequest, v1::GetStatusResponse>>();
  probe->context.set_wait_for_ready(true);
  UnaryCall<v1::GetStatusRequest, v1::GetStatusResponse>* const probing = probe.get();
  Start<v1::GetStatusRequest, v1::GetStatusResponse>(
      std::move(probe), connect_by,
      [&](grpc::ClientContext* context, std::function<void(grpc::Status)> callback) {
        stub_->async()->GetStatus(context, &probing->request, &probing->response,
                                  std::move(callback));
      },
      [this, request = std::move(request), deadline, tried = connect_by - now, cancellations,
       done = std::move(done)](const absl::StatusOr<v1::GetStatusResponse>& answer) mutable {
        const absl::StatusCode code = answer.status().code();
        // A connected channel whose probe ran out of time: the worker (or,
        // in a burst of thousands, this coordinator) was slow, not gone.
        if (code == absl::StatusCode::kDeadlineExceeded &&
            channel_->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY) {
          done(absl::DeadlineExceededError(absl::StrCat(
              address_, " is connected but did not answer within ", absl::FormatDuration(tried))));
          return;
        }
        if (code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded) {
          done(absl::UnavailableError(absl::StrCat("cannot connect to ", address_, " (tried for ",
                                                   absl::FormatDuration(tried), ")")));
          return;
        }
        if (code == absl::StatusCode::kCancelled) {
          done(answer.status());
          return;
        }
        auto call = std::make_unique<UnaryCall<v1::ConfigureRequest, v1::ConfigureResponse>>();
        call->request = std::move(request);
        UnaryCall<v1::ConfigureRequest, v1::ConfigureResponse>* const started = call.get();
        Start<v1::ConfigureRequest, v1::ConfigureResponse>(
            std::move(call), deadline,
            [&](grpc::ClientContext* context, std::function<void(grpc::Status)> callback) {
              stub_->async()->Configure(context, &started->request, &started->response,
                                        std::move(callback));
            },
            [done = std::move(done)](const absl::StatusOr<v1::ConfigureResponse>& configured) {
              done(configured.status());
            },
            cancellations);  // a CancelAll since the probe began cancels it too
      },
      cancellations);  // and one since the count was read, the probe
}

void GrpcWorkerClient::JoinSummonAsync(const v1::CommandBatch* batch, absl::Time deadline,
                                       JoinSummonDone done) {
  auto call = std::make_unique<UnaryCall<JoinedSummonReader, std::nullptr_t>>();
  JoinedSummonReader* const reader = &call->request;
  Start<JoinedSummonReader, std::nullptr_t>(
      std::move(call), deadline,
      [&](grpc::ClientContext* context, std::function<void(grpc::Status)> callback) {
        reader->Begin(stub_.get(), context, batch, address_, std::move(callback));
      },
      [done = std::move(done)](const absl::StatusOr<std::nullptr_t>& answer) {
        done(answer.status());
      });
}

absl::Status GrpcWorkerClient::Summon(const v1::CommandBatch& batch, absl::Time deadline,
                                      const ChunkSink& sink) {
  BlockingCall call(mu_, idle_, blocking_, disconnected_, deadline, command_token_);
  if (call.refused()) return DisconnectedError();
  std::unique_ptr<grpc::ClientReader<v1::TensorChunk>> reader =
      stub_->Summon(call.context(), batch);
  v1::TensorChunk chunk;
  absl::Status sunk;
  while (reader->Read(&chunk)) {
    sunk = sink(chunk);
    if (!sunk.ok()) {
      call.context()->TryCancel();
      break;
    }
  }
  const absl::Status finished = FromGrpcStatus(reader->Finish());
  return sunk.ok() ? finished : sunk;
}

}  // namespace flatshard
