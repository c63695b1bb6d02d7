#include "coordinator/service/guarded_job_service.h"

#include <optional>
#include <string>

#include <google/protobuf/descriptor.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

#include "proto/grpc_status.h"

namespace flatshard {
namespace {

// A job spec (a model of many modules) may be large; nothing else is.
constexpr size_t kSpecRequestBytes = 8 << 20;
constexpr size_t kRequestBytes = 64 << 10;

constexpr CallPolicy kPolicies[] = {
    // name, needs, audited, expensive, streaming, max_request_bytes
    {"CreateJob", Role::kAdmin, true, false, false, kSpecRequestBytes},
    {"DeleteJob", Role::kAdmin, true, false, false, kRequestBytes},
    {"DeleteCheckpoint", Role::kAdmin, true, false, false, kRequestBytes},
    {"Train", Role::kOperator, true, false, true, kRequestBytes},
    {"StopTraining", Role::kOperator, true, false, false, kRequestBytes},
    {"Unshard", Role::kOperator, true, false, false, kRequestBytes},
    {"Reshard", Role::kOperator, true, false, false, kRequestBytes},
    {"SummonFullParams", Role::kOperator, true, true, true, kRequestBytes},
    {"SetStateDictSettings", Role::kOperator, true, false, false, kRequestBytes},
    {"SaveCheckpoint", Role::kOperator, true, true, true, kRequestBytes},
    {"LoadCheckpoint", Role::kOperator, true, false, true, kRequestBytes},
    {"GetJob", Role::kViewer, false, false, false, kRequestBytes},
    {"ListJobs", Role::kViewer, false, false, false, kRequestBytes},
    {"ListWorkers", Role::kViewer, false, false, false, kRequestBytes},
    {"ListCheckpoints", Role::kViewer, false, false, false, kRequestBytes},
    {"WatchEvents", Role::kViewer, false, false, true, kRequestBytes},
    {"Plan", Role::kViewer, false, true, false, kSpecRequestBytes},
};

const CallPolicy* FindPolicy(absl::string_view method) {
  for (const CallPolicy& p : kPolicies) {
    if (method == p.name) return &p;
  }
  return nullptr;
}

// What a call acts on, for the audit line: "job", "job/checkpoint", or the
// name of the job a spec creates.
std::string Target(const google::protobuf::Message& request) {
  const google::protobuf::Descriptor* d = request.GetDescriptor();
  const google::protobuf::Reflection* r = request.GetReflection();
  auto string_field = [&](const char* name) -> std::string {
    const google::protobuf::FieldDescriptor* f = d->FindFieldByName(name);
    if (f == nullptr || f->is_repeated() ||
        f->type() != google::protobuf::FieldDescriptor::TYPE_STRING) {
      return "";
    }
    return r->GetString(request, f);
  };
  const std::string job = string_field("job");
  std::string name = string_field("name");
  if (!job.empty()) return name.empty() ? job : job + "/" + name;
  if (!name.empty()) return name;
  if (const auto* spec = d->FindFieldByName("spec");
      spec != nullptr && spec->type() == google::protobuf::FieldDescriptor::TYPE_MESSAGE) {
    return Target(r->GetMessage(request, spec));
  }
  return "";
}

// Clients are counted by who they are; anonymous ones by host, so one host
// cannot take every slot by reconnecting.
std::string ClientKey(const grpc::ServerContext& context, const Principal& who, bool open) {
  if (!open) return who.name;
  std::string peer = context.peer();  // "ipv4:127.0.0.1:5555"
  if (const size_t colon = peer.rfind(':'); colon != std::string::npos) peer.resize(colon);
  return peer;
}

}  // namespace

std::span<const CallPolicy> JobServiceCallPolicies() { return kPolicies; }

template <typename Call>
grpc::Status GuardedJobService::Guard(grpc::ServerContext& context, const char* method,
                                      const google::protobuf::Message& request, Call&& call) {
  const CallPolicy* policy = FindPolicy(method);
  if (policy == nullptr) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        std::string(method) + " has no access policy");
  }
  if (const size_t bytes = request.ByteSizeLong(); bytes > policy->max_request_bytes) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat(method, ": the request is ", bytes,
                                     " bytes; limit request_bytes is ", policy->max_request_bytes));
  }
  absl::StatusOr<Principal> who = auth_->Identify(context);
  if (!who.ok()) {
    if (policy->audited) {
      auth_->Audit(context, Principal{"unidentified", Role::kViewer}, method, Target(request),
                   ToGrpcStatus(who.status()));
    }
    return ToGrpcStatus(who.status());
  }
  if (absl::Status permitted = auth_->Permit(*who, method, policy->needs); !permitted.ok()) {
    if (policy->audited) {
      auth_->Audit(context, *who, method, Target(request), ToGrpcStatus(permitted));
    }
    return ToGrpcStatus(permitted);
  }
  const std::string client = ClientKey(context, *who, auth_->open());
  grpc::Status result;
  std::optional<RequestLimits::StreamSlot> slot;
  absl::Status admitted = absl::OkStatus();
  // The stream slot first: a call refused for want of one must not also
  // spend the client's budget of expensive calls.
  if (policy->streaming) {
    absl::StatusOr<RequestLimits::StreamSlot> s = limits_->AdmitStream(client, method);
    if (s.ok()) {
      slot.emplace(*std::move(s));
    } else {
      admitted = s.status();
    }
  }
  if (admitted.ok() && policy->expensive) {
    admitted = limits_->AdmitExpensive(client, method, absl::Now());
  }
  if (admitted.ok() && policy->audited && policy->streaming) {
    auth_->AuditStarted(context, *who, method, Target(request));
  }
  result = admitted.ok() ? call(*who) : ToGrpcStatus(admitted);
  if (policy->audited) auth_->Audit(context, *who, method, Target(request), result);
  return result;
}

// NOLINTBEGIN(bugprone-macro-parentheses): the arguments are a name and types.
#define FLATSHARD_GUARDED_CALL(Method, Request, Response)                                       \
  grpc::Status GuardedJobService::Method(grpc::ServerContext* context, const Request* request,  \
                                         Response* response) {                                  \
    return Guard(*context, #Method, *request,                                                   \
                 [&](const Principal&) { return inner_->Method(context, request, response); }); \
  }

FLATSHARD_GUARDED_CALL(CreateJob, v1::CreateJobRequest, v1::CreateJobResponse)
FLATSHARD_GUARDED_CALL(GetJob, v1::GetJobRequest, v1::GetJobResponse)
FLATSHARD_GUARDED_CALL(ListJobs, v1::ListJobsRequest, v1::ListJobsResponse)
FLATSHARD_GUARDED_CALL(DeleteJob, v1::DeleteJobRequest, v1::DeleteJobResponse)
FLATSHARD_GUARDED_CALL(Plan, v1::PlanRequest, v1::PlanResponse)
FLATSHARD_GUARDED_CALL(ListWorkers, v1::ListWorkersRequest, v1::ListWorkersResponse)
// A training is started by whom the call proved to be; what the client says
// of itself (user@host) only follows, so no caller can put another's name
// on a training.
grpc::Status GuardedJobService::Train(grpc::ServerContext* context, const v1::TrainRequest* request,
                                      grpc::ServerWriter<v1::StepResult>* writer) {
  return Guard(*context, "Train", *request, [&](const Principal& who) {
    if (auth_->open() || request->attach()) return inner_->Train(context, request, writer);
    v1::TrainRequest attributed = *request;
    attributed.set_started_by(request->started_by().empty()
                                  ? who.name
                                  : absl::StrCat(who.name, " (", request->started_by(), ")"));
    return inner_->Train(context, &attributed, writer);
  });
}

FLATSHARD_GUARDED_CALL(StopTraining, v1::StopTrainingRequest, v1::StopTrainingResponse)
FLATSHARD_GUARDED_CALL(Unshard, v1::UnshardRequest, v1::UnshardResponse)
FLATSHARD_GUARDED_CALL(Reshard, v1::ReshardRequest, v1::ReshardResponse)
FLATSHARD_GUARDED_CALL(SummonFullParams, v1::SummonFullParamsRequest,
                       grpc::ServerWriter<v1::TensorChunk>)
FLATSHARD_GUARDED_CALL(SetStateDictSettings, v1::SetStateDictSettingsRequest,
                       v1::SetStateDictSettingsResponse)
FLATSHARD_GUARDED_CALL(WatchEvents, v1::WatchEventsRequest, grpc::ServerWriter<v1::JobEvent>)
FLATSHARD_GUARDED_CALL(SaveCheckpoint, v1::SaveCheckpointRequest,
                       grpc::ServerWriter<v1::CheckpointProgress>)
FLATSHARD_GUARDED_CALL(LoadCheckpoint, v1::LoadCheckpointRequest,
                       grpc::ServerWriter<v1::CheckpointProgress>)
FLATSHARD_GUARDED_CALL(ListCheckpoints, v1::ListCheckpointsRequest, v1::ListCheckpointsResponse)
FLATSHARD_GUARDED_CALL(DeleteCheckpoint, v1::DeleteCheckpointRequest, v1::DeleteCheckpointResponse)

#undef FLATSHARD_GUARDED_CALL
// NOLINTEND(bugprone-macro-parentheses)

}  // namespace flatshard
