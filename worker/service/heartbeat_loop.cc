#include "worker/service/heartbeat_loop.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include <grpcpp/client_context.h>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

#include "proto/grpc_status.h"

namespace flatshard {
namespace {

std::chrono::system_clock::time_point Deadline(absl::Duration d) {
  return std::chrono::system_clock::now() + absl::ToChronoMilliseconds(d);
}

}  // namespace

HeartbeatLoop::HeartbeatLoop(std::shared_ptr<grpc::Channel> channel,
                             v1::RegisterRequest registration, WorkerServiceImpl* service,
                             std::shared_ptr<WorkerCallCredentials> credentials,
                             absl::Duration coordinator_timeout)
    : stub_(v1::Membership::NewStub(std::move(channel))),
      registration_(std::move(registration)),
      service_(service),
      credentials_(std::move(credentials)),
      coordinator_timeout_(coordinator_timeout) {}

HeartbeatLoop::~HeartbeatLoop() { Stop(); }

absl::StatusOr<int> HeartbeatLoop::Register(absl::Duration connect_timeout) {
  grpc::ClientContext context;
  // Wait for the coordinator to come up rather than fail on the first try.
  context.set_wait_for_ready(true);
  context.set_deadline(Deadline(connect_timeout));
  credentials_->AttachJoinToken(context);
  v1::RegisterResponse response;
  const grpc::Status status = stub_->Register(&context, registration_, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  credentials_->set_session(response.session());
  if (response.heartbeat_interval_seconds() > 0) {
    interval_ = absl::Seconds(response.heartbeat_interval_seconds());
  }
  return response.rank();
}

void HeartbeatLoop::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  stop_ = false;
  thread_ = std::thread([this] { Run(); });
  aborter_ = std::thread([this] { RunAborts(); });
}

void HeartbeatLoop::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  abort_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (aborter_.joinable()) aborter_.join();
}

void HeartbeatLoop::RequestAbort(std::string reason, uint64_t epoch, bool only_while_running) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_abort_ = PendingAbort{std::move(reason), epoch, only_while_running};
  }
  abort_cv_.notify_all();
}

void HeartbeatLoop::RunAborts() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    abort_cv_.wait(lock, [this] { return stop_ || pending_abort_.has_value(); });
    if (stop_) return;  // the worker's shutdown aborts what still runs
    PendingAbort abort = *std::move(pending_abort_);
    pending_abort_.reset();
    lock.unlock();
    if (!abort.only_while_running || service_->Status().state == "running") {
      service_->AbortJob(abort.reason, abort.epoch);
    }
    lock.lock();
  }
}

absl::Status HeartbeatLoop::Beat() {
  const WorkerStatus status = service_->Status();
  v1::HeartbeatRequest request;
  request.set_worker_id(registration_.worker_id());
  request.set_last_completed_seq(status.last_completed_seq);
  request.set_state(status.state);
  grpc::ClientContext context;
  context.set_deadline(Deadline(interval_));
  credentials_->AttachSession(context);
  v1::HeartbeatResponse response;
  grpc::Status rpc = stub_->Heartbeat(&context, request, &response);
  if (rpc.error_code() == grpc::StatusCode::NOT_FOUND) {
    spdlog::warn("coordinator does not know worker {}: registering again",
                 registration_.worker_id());
    return Register(interval_).status();
  }
  if (!rpc.ok()) return FromGrpcStatus(rpc);
  if (response.abort() && status.job_epoch == response.epoch() && status.state != "aborted") {
    RequestAbort(absl::StrCat("the coordinator failed job epoch ", response.epoch()),
                 response.epoch());
  }
  return absl::OkStatus();
}

void HeartbeatLoop::Run() {
  int failures = 0;
  // The coordinator's silence is timed on the monotonic clock, as the abort
  // watchdog's grace is: a wall-clock step (NTP) must neither abort a healthy
  // batch nor hold off a real one.
  using Clock = std::chrono::steady_clock;
  const auto silent_for = [](Clock::time_point since) {
    return absl::FromChrono(Clock::now() - since);
  };
  Clock::time_point last_answer = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    const absl::Status status = Beat();
    if (status.ok()) {
      last_answer = Clock::now();
    } else if (silent_for(last_answer) > coordinator_timeout_) {
      // The coordinator is gone; with a batch in flight, it may have reached
      // only some ranks, whose collectives would wait for the others until
      // the collective timeout. Abort it; a restarted coordinator then finds
      // the ranks disagree and rolls back instead of waiting.
      if (const WorkerStatus now = service_->Status(); now.state == "running") {
        RequestAbort(
            absl::StrCat("no answer from the coordinator for ",
                         absl::FormatDuration(coordinator_timeout_), " with a batch in flight"),
            now.job_epoch, /*only_while_running=*/true);
        spdlog::warn("aborting the batch in flight: the coordinator has not answered for {}",
                     absl::FormatDuration(silent_for(last_answer)));
      }
    }
    lock.lock();
    if (!status.ok()) {
      // Say it once per outage, not once per beat.
      if (failures++ == 0) spdlog::warn("heartbeat failed: {}", std::string(status.message()));
    } else if (failures > 0) {
      spdlog::info("heartbeats resumed after {} failures", failures);
      failures = 0;
    }
    WaitForNextBeat(lock);
  }
}

void HeartbeatLoop::BatchEnded() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch_ended_ = true;
  }
  cv_.notify_all();
}

void HeartbeatLoop::WaitForNextBeat(std::unique_lock<std::mutex>& lock) {
  // During training the next batch begins within milliseconds of the last
  // one's end; a worker still idle after this long has finished.
  constexpr auto kSettle = std::chrono::milliseconds(100);
  using Clock = std::chrono::steady_clock;
  const auto due = Clock::now() + absl::ToChronoMilliseconds(interval_);
  const auto ended = [this] { return stop_ || batch_ended_; };
  // The due time bounds every wait: steps shorter than kSettle end a batch
  // inside each settle window, and a loop that only left when one did not
  // would stop beating for as long as such training ran.
  while (!stop_ && Clock::now() < due) {
    if (!cv_.wait_until(lock, due, ended) || stop_) return;  // due, or stopped
    batch_ended_ = false;
    if (cv_.wait_until(lock, std::min(Clock::now() + kSettle, due), ended)) continue;
    if (Clock::now() >= due) return;
    lock.unlock();  // not held across the service's lock: no order between the two to keep
    const bool idle = service_->Status().state != "running";
    lock.lock();
    if (idle) return;  // beat now
  }
}

}  // namespace flatshard
