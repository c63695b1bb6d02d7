#include "client/flatshard_client.h"

#include <fstream>
#include <optional>

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "rpc/call_metadata.h"
#include "rpc/keepalive.h"
#include "rpc/read_retries.h"

#include "core/status_macros.h"
#include "proto/grpc_status.h"

namespace flatshard {
namespace {

constexpr int kMaxMessageBytes = 64 << 20;
constexpr absl::Duration kUnaryTimeout = absl::Seconds(60);

void SetDeadline(grpc::ClientContext& context, absl::Duration timeout) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

}  // namespace

FlatshardClient::FlatshardClient(const std::string& address)
    : FlatshardClient(CoordinatorTarget{address, {}, "", ""}) {}

FlatshardClient::FlatshardClient(const CoordinatorTarget& target) : address_(target.address) {
  absl::StatusOr<std::optional<TlsMaterial>> tls = LoadTls(target.tls, TlsRole::kClient);
  token_ = target.token;
  if (!tls.ok()) {
    setup_ = tls.status();
  } else if (token_.empty() && !target.token_file.empty()) {
    std::ifstream in(target.token_file);
    if (!in || !std::getline(in, token_) || token_.empty()) {
      setup_ = absl::InvalidArgumentError(absl::StrCat(
          "--token-file '", target.token_file, "' cannot be read or its first line is empty"));
    }
    token_ = std::string(absl::StripAsciiWhitespace(token_));
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  // A Train or watch stream notices a coordinator that vanished.
  ApplyClientKeepalive(args);
  // A read after a coordinator restart does not fail on the dead connection.
  ApplyReadRetries(args);
  const TlsMaterial* material = tls.ok() && tls->has_value() ? &**tls : nullptr;
  stub_ = v1::JobService::NewStub(grpc::CreateCustomChannel(
      target.address, ChannelCredentials(material, kCoordinatorIdentity), args));
}

absl::Status FlatshardClient::Prepare(grpc::ClientContext& context) const {
  if (!setup_.ok()) return setup_;
  if (!token_.empty()) context.AddMetadata(kAuthorizationKey, "Bearer " + token_);
  return absl::OkStatus();
}

absl::Status FlatshardClient::Error(const grpc::Status& status) const {
  absl::Status s = FromGrpcStatus(status);
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return s;
  const std::string& message = status.error_message();
  if (message.find("failed to connect") == std::string::npos) return s;  // from the server
  // Our own check of the server's role (rpc/tls_credentials.cc): a server
  // answered, but not as the coordinator.
  if (message.find("presented the certificate of") != std::string::npos) {
    return absl::UnavailableError(
        absl::StrCat("the server at ", address_, " is not the coordinator (", message, ")"));
  }
  // gRPC's host check (1.51's TLS verifier, and its older SSL path).
  if (message.find("Hostname Verification") != std::string::npos ||
      message.find("No match found for server name") != std::string::npos) {
    return absl::UnavailableError(absl::StrCat(
        "the coordinator's certificate does not name the host of ", address_, " (", message,
        "): dial it by a name its certificate carries, or renew it for this host (`flatshard "
        "certs renew DIR --hosts ...`)"));
  }
  // A TLS server closes a plaintext connection, and a mutual-TLS server one
  // without a client certificate, before any call: say that, not "no
  // coordinator".
  if (message.find("Socket closed") != std::string::npos ||
      message.find("andshake") != std::string::npos || message.find("SSL") != std::string::npos ||
      message.find("ssl") != std::string::npos) {
    return absl::UnavailableError(absl::StrCat(
        "the coordinator at ", address_, " refused the connection during setup (", message,
        "): it serves TLS; give --tls-ca (FLATSHARD_TLS_CA), and --tls-cert/--tls-key when it "
        "requires client certificates"));
  }
  return absl::UnavailableError(absl::StrCat("no coordinator at ", address_, " (", message,
                                             "); start one with `flatshard up`"));
}

absl::StatusOr<v1::Job> FlatshardClient::CreateJob(const v1::JobSpec& spec) {
  grpc::ClientContext context;
  RETURN_IF_ERROR(Prepare(context));
  SetDeadline(context, kUnaryTimeout);
  v1::CreateJobRequest request;
  *request.mutable_spec() = spec;
  v1::CreateJobResponse response;
  grpc::Status status = stub_->CreateJob(&context, request, &response);
  if (!status.ok()) return Error(status);
  return response.job();
}

absl::StatusOr<v1::Job> FlatshardClient::GetJob(const std::string& name) {
  grpc::ClientContext context;
  RETURN_IF_ERROR(Prepare(context));
  SetDeadline(context, kUnaryTimeout);
  v1::GetJobRequest request;
  request.set_name(name);
  v1::GetJobResponse response;
  grpc::Status status = stub_->GetJob(&context, request, &response);
  if (!status.ok()) return Error(status);
  return response.job();
}

absl::Status FlatshardClient::DeleteJob(const std::string& name) {
  grpc::ClientContext context;
  RETURN_IF_ERROR(Prepare(context));
  SetDeadline(context, kUnaryTimeout);
  v1::DeleteJobRequest request;
  request.set_name(name);
  v1::DeleteJobResponse response;
  grpc::Status status = stub_->DeleteJob(&context, request, &response);
  return status.ok() ? absl::OkStatus() : Error(status);
}

absl::StatusOr<std::string> FlatshardClient::Plan(const v1::JobSpec& spec) {
  grpc::ClientContext context;
  RETURN_IF_ERROR(Prepare(context));
  SetDeadline(context, kUnaryTimeout);
  v1::PlanRequest request;
  *request.mutable_spec() = spec;
  v1::PlanResponse response;
  grpc::Status status = stub_->Plan(&context, request, &response);
  if (!status.ok()) return Error(status);
  return response.plan_json();
}

absl::StatusOr<std::vector<v1::WorkerInfo>> FlatshardClient::ListWorkers(const std::string& job) {
  grpc::ClientContext context;
  RETURN_IF_ERROR(Prepare(context));
  SetDeadline(context, kUnaryTimeout);
  v1::ListWorkersRequest request;
  request.set_job(job);
  v1::ListWorkersResponse response;
  grpc::Status status = stub_->ListWorkers(&context, request, &response);
  if (!status.ok()) return Error(status);
  return std::vector<v1::WorkerInfo>(response.workers().begin(), response.workers().end());
}

absl::Status FlatshardClient::Train(const std::string& job, int64_t steps, int no_sync_micro_steps,
                                    const std::function<void(const v1::StepResult&)>& on_step) {
  v1::TrainRequest request;
  request.set_job(job);
  request.set_steps(steps);
  request.set_no_sync_micro_steps(no_sync_micro_steps);
  return Train(request, on_step);
}

absl::Status FlatshardClient::Train(const v1::TrainRequest& request,
                                    const std::function<void(const v1::StepResult&)>& on_step) {
  grpc::ClientContext context;
  RETURN_IF_ERROR(Prepare(context));
  std::unique_ptr<grpc::ClientReader<v1::StepResult>> reader = stub_->Train(&context, request);
  v1::StepResult result;
  while (reader->Read(&result)) on_step(result);
  grpc::Status status = reader->Finish();
  return status.ok() ? absl::OkStatus() : Error(status);
}

absl::StatusOr<v1::StopTrainingResponse> FlatshardClient::StopTraining(const std::string& job) {
  grpc::ClientContext context;
  RETURN_IF_ERROR(Prepare(context));
  SetDeadline(context, kUnaryTimeout);
  v1::StopTrainingRequest request;
  request.set_job(job);
  v1::StopTrainingResponse response;
  grpc::Status status = stub_->StopTraining(&context, request, &response);
  if (!status.ok()) return Error(status);
  return response;
}

absl::Status FlatshardClient::Unshard(const std::string& job, const std::vector<int>& units) {
  grpc::ClientContext context;
  RETURN_IF_ERROR(Prepare(context));
  SetDeadline(context, kUnaryTimeout);
  v1::UnshardRequest request;
  request.set_job(job);
  for (int u : units) request.add_unit_indices(u);
  v1::UnshardResponse response;
  grpc::Status status = stub_->Unshard(&context, request, &response);
  return status.ok() ? absl::OkStatus() : Error(status);
}

absl::Status FlatshardClient::Reshard(const std::string& job, const std::vector<int>& units) {
  grpc::ClientContext context;
  RETURN_IF_ERROR(Prepare(context));
  SetDeadline(context, kUnaryTimeout);
  v1::ReshardRequest request;
  request.set_job(job);
  for (int u : units) request.add_unit_indices(u);
  v1::ReshardResponse response;
  grpc::Status status = stub_->Reshard(&context, request, &response);
  return status.ok() ? absl::OkStatus() : Error(status);
}

absl::Status FlatshardClient::SummonFullParams(
    const std::string& job, bool with_grads, int64_t chunk_bytes,
    const std::function<absl::Status(const v1::TensorChunk&)>& on_chunk) {
  grpc::ClientContext context;
  RETURN_IF_ERROR(Prepare(context));
  v1::SummonFullParamsRequest request;
  request.set_job(job);
  request.set_with_grads(with_grads);
  request.set_chunk_bytes(chunk_bytes);
  std::unique_ptr<grpc::ClientReader<v1::TensorChunk>> reader =
      stub_->SummonFullParams(&context, request);
  v1::TensorChunk chunk;
  absl::Status sunk;
  while (reader->Read(&chunk)) {
    sunk = on_chunk(chunk);
    if (!sunk.ok()) {
      context.TryCancel();
      break;
    }
  }
  grpc::Status status = reader->Finish();
  if (!sunk.ok()) return sunk;
  return status.ok() ? absl::OkStatus() : Error(status);
}

absl::StatusOr<v1::StateDictSettings> FlatshardClient::SetStateDictSettings(
    const std::string& job, const v1::StateDictSettings& settings) {
  grpc::ClientContext context;
  RETURN_IF_ERROR(Prepare(context));
  SetDeadline(context, kUnaryTimeout);
  v1::SetStateDictSettingsRequest request;
  request.set_job(job);
  *request.mutable_settings() = settings;
  v1::SetStateDictSettingsResponse response;
  grpc::Status status = stub_->SetStateDictSettings(&context, request, &response);
  if (!status.ok()) return Error(status);
  return response.previous();
}

namespace {

absl::StatusOr<v1::CheckpointProgress> LastProgress(
    grpc::ClientReader<v1::CheckpointProgress>& reader,
    const std::function<void(const v1::CheckpointProgress&)>& on_progress = {}) {
  v1::CheckpointProgress progress, last;
  bool any = false;
  while (reader.Read(&progress)) {
    if (on_progress) on_progress(progress);
    last = progress;
    any = true;
  }
  if (!any) return absl::InternalError("the coordinator sent no progress");
  return last;
}

}  // namespace

absl::StatusOr<v1::CheckpointProgress> FlatshardClient::SaveCheckpoint(
    const v1::SaveCheckpointRequest& request,
    const std::function<void(const v1::CheckpointProgress&)>& on_progress) {
  grpc::ClientContext context;
  RETURN_IF_ERROR(Prepare(context));
  std::unique_ptr<grpc::ClientReader<v1::CheckpointProgress>> reader =
      stub_->SaveCheckpoint(&context, request);
  absl::StatusOr<v1::CheckpointProgress> last = LastProgress(*reader, on_progress);
  grpc::Status status = reader->Finish();
  if (!status.ok()) return Error(status);
  return last;
}

absl::StatusOr<v1::CheckpointProgress> FlatshardClient::LoadCheckpoint(const std::string& job,
                                                                       const std::string& name) {
  grpc::ClientContext context;
  RETURN_IF_ERROR(Prepare(context));
  v1::LoadCheckpointRequest request;
  request.set_job(job);
  request.set_name(name);
  std::unique_ptr<grpc::ClientReader<v1::CheckpointProgress>> reader =
      stub_->LoadCheckpoint(&context, request);
  absl::StatusOr<v1::CheckpointProgress> last = LastProgress(*reader);
  grpc::Status status = reader->Finish();
  if (!status.ok()) return Error(status);
  return last;
}

absl::StatusOr<std::vector<v1::Job>> FlatshardClient::ListJobs() {
  grpc::ClientContext context;
  RETURN_IF_ERROR(Prepare(context));
  SetDeadline(context, kUnaryTimeout);
  v1::ListJobsResponse response;
  grpc::Status status = stub_->ListJobs(&context, v1::ListJobsRequest{}, &response);
  if (!status.ok()) return Error(status);
  return std::vector<v1::Job>(response.jobs().begin(), response.jobs().end());
}

absl::StatusOr<std::vector<v1::CheckpointInfo>> FlatshardClient::ListCheckpoints(
    const std::string& job) {
  grpc::ClientContext context;
  RETURN_IF_ERROR(Prepare(context));
  SetDeadline(context, kUnaryTimeout);
  v1::ListCheckpointsRequest request;
  request.set_job(job);
  v1::ListCheckpointsResponse response;
  grpc::Status status = stub_->ListCheckpoints(&context, request, &response);
  if (!status.ok()) return Error(status);
  return std::vector<v1::CheckpointInfo>(response.checkpoints().begin(),
                                         response.checkpoints().end());
}

absl::Status FlatshardClient::DeleteCheckpoint(const std::string& job, const std::string& name) {
  grpc::ClientContext context;
  RETURN_IF_ERROR(Prepare(context));
  SetDeadline(context, kUnaryTimeout);
  v1::DeleteCheckpointRequest request;
  request.set_job(job);
  request.set_name(name);
  v1::DeleteCheckpointResponse response;
  grpc::Status status = stub_->DeleteCheckpoint(&context, request, &response);
  return status.ok() ? absl::OkStatus() : Error(status);
}

absl::Status FlatshardClient::WatchEvents(
    const std::string& job, const std::function<bool(const v1::JobEvent&)>& on_event) {
  grpc::ClientContext context;
  RETURN_IF_ERROR(Prepare(context));
  v1::WatchEventsRequest request;
  request.set_job(job);
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader = stub_->WatchEvents(&context, request);
  v1::JobEvent event;
  while (reader->Read(&event)) {
    if (!on_event(event)) {
      context.TryCancel();
      reader->Finish();
      return absl::OkStatus();
    }
  }
  grpc::Status status = reader->Finish();
  return status.ok() ? absl::OkStatus() : Error(status);
}

absl::StatusOr<v1::JobState> FlatshardClient::WaitForState(const std::string& job,
                                                           const std::set<v1::JobState>& states,
                                                           absl::Duration timeout,
                                                           const std::set<v1::JobState>& after) {
  grpc::ClientContext context;
  RETURN_IF_ERROR(Prepare(context));
  SetDeadline(context, timeout);
  v1::WatchEventsRequest request;
  request.set_job(job);
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader = stub_->WatchEvents(&context, request);
  v1::JobEvent event;
  absl::StatusOr<v1::JobState> result = absl::DeadlineExceededError(
      absl::StrCat("job '", job, "' did not reach the state in ", absl::FormatDuration(timeout)));
  v1::JobState last = v1::JOB_STATE_UNSPECIFIED;
  std::string failure;
  bool counting = after.empty();
  while (reader->Read(&event)) {
    last = event.state();
    if (!counting) {
      counting = after.contains(last);
      continue;
    }
    if (last == v1::FAILED) failure = event.message();
    // Events replay from the job's creation: this returns once the job has
    // been in one of `states` (since `after`), now or earlier.
    if (states.contains(last)) {
      result = last;
      break;
    }
    if (last == v1::FAILED || last == v1::STOPPED) {
      result = absl::FailedPreconditionError(absl::StrCat(
          "job '", job, "' is ", v1::JobState_Name(last), failure.empty() ? "" : ": ", failure));
      break;
    }
  }
  // Ended here, not by the stream: the coordinator would go on sending.
  // (Cancelling a stream that ended by itself would hide why it ended.)
  if (result.ok() || result.status().code() != absl::StatusCode::kDeadlineExceeded) {
    context.TryCancel();
  }
  grpc::Status status = reader->Finish();
  // The coordinator may see the deadline first and end the stream CANCELLED.
  const bool deadline_passed = status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
                               (status.error_code() == grpc::StatusCode::CANCELLED &&
                                absl::Now() >= absl::FromChrono(context.deadline()));
  if (!result.ok() && result.status().code() == absl::StatusCode::kDeadlineExceeded &&
      !deadline_passed) {
    if (!status.ok()) return Error(status);
    // Ended by the coordinator before the deadline: not a timeout.
    return absl::UnavailableError(absl::StrCat("the coordinator ended the watch of job '", job,
                                               "' before it reached the state"));
  }
  return result;
}

}  // namespace flatshard
