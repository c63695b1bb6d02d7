// JobService as the coordinator serves it: every call authenticated and
// authorized (coordinator/service/authenticator.h) against the role it needs,
// held to the request limits, and every call that changes state or reads the
// model audited, before and whatever JobServiceImpl then does. The role each
// call needs is in one table (kJobServiceCalls), which a test checks covers
// every method of the service.
#ifndef FLATSHARD_COORDINATOR_SERVICE_GUARDED_JOB_SERVICE_H_
#define FLATSHARD_COORDINATOR_SERVICE_GUARDED_JOB_SERVICE_H_

#include <span>

#include <google/protobuf/message.h>

#include "coordinator/service/access_policy.h"
#include "coordinator/service/authenticator.h"
#include "coordinator/service/job_service.h"
#include "coordinator/service/request_limits.h"
#include "flatshard/v1/job.grpc.pb.h"

namespace flatshard {

struct CallPolicy {
  const char* name;  // the JobService method
  Role needs;
  bool audited;              // changes state, or reads the model out
  bool expensive;            // rate limited
  bool streaming;            // counts against the client's concurrent streams
  size_t max_request_bytes;  // larger requests are RESOURCE_EXHAUSTED
};

// The policy of every JobService method; UNIMPLEMENTED-safe: a method missing
// here is refused (and the test catches it).
std::span<const CallPolicy> JobServiceCallPolicies();

class GuardedJobService final : public v1::JobService::Service {
 public:
  // All must outlive the service.
  GuardedJobService(JobServiceImpl* inner, Authenticator* auth, RequestLimits* limits)
      : inner_(inner), auth_(auth), limits_(limits) {}

  grpc::Status CreateJob(grpc::ServerContext* context, const v1::CreateJobRequest* request,
                         v1::CreateJobResponse* response) override;
  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                      v1::GetJobResponse* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status DeleteJob(grpc::ServerContext* context, const v1::DeleteJobRequest* request,
                         v1::DeleteJobResponse* response) override;
  grpc::Status Plan(grpc::ServerContext* context, const v1::PlanRequest* request,
                    v1::PlanResponse* response) override;
  grpc::Status ListWorkers(grpc::ServerContext* context, const v1::ListWorkersRequest* request,
                           v1::ListWorkersResponse* response) override;
  grpc::Status Train(grpc::ServerContext* context, const v1::TrainRequest* request,
                     grpc::ServerWriter<v1::StepResult>* writer) override;
  grpc::Status StopTraining(grpc::ServerContext* context, const v1::StopTrainingRequest* request,
                            v1::StopTrainingResponse* response) override;
  grpc::Status Unshard(grpc::ServerContext* context, const v1::UnshardRequest* request,
                       v1::UnshardResponse* response) override;
  grpc::Status Reshard(grpc::ServerContext* context, const v1::ReshardRequest* request,
                       v1::ReshardResponse* response) override;
  grpc::Status SummonFullParams(grpc::ServerContext* context,
                                const v1::SummonFullParamsRequest* request,
                                grpc::ServerWriter<v1::TensorChunk>* writer) override;
  grpc::Status SetStateDictSettings(grpc::ServerContext* context,
                                    const v1::SetStateDictSettingsRequest* request,
                                    v1::SetStateDictSettingsResponse* response) override;
  grpc::Status WatchEvents(grpc::ServerContext* context, const v1::WatchEventsRequest* request,
                           grpc::ServerWriter<v1::JobEvent>* writer) override;
  grpc::Status SaveCheckpoint(grpc::ServerContext* context,
                              const v1::SaveCheckpointRequest* request,
                              grpc::ServerWriter<v1::CheckpointProgress>* writer) override;
  grpc::Status LoadCheckpoint(grpc::ServerContext* context,
                              const v1::LoadCheckpointRequest* request,
                              grpc::ServerWriter<v1::CheckpointProgress>* writer) override;
  grpc::Status ListCheckpoints(grpc::ServerContext* context,
                               const v1::ListCheckpointsRequest* request,
                               v1::ListCheckpointsResponse* response) override;
  grpc::Status DeleteCheckpoint(grpc::ServerContext* context,
                                const v1::DeleteCheckpointRequest* request,
                                v1::DeleteCheckpointResponse* response) override;

 private:
  template <typename Call>
  grpc::Status Guard(grpc::ServerContext& context, const char* method,
                     const google::protobuf::Message& request, Call&& call);

  JobServiceImpl* inner_;
  Authenticator* auth_;
  RequestLimits* limits_;
};

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_SERVICE_GUARDED_JOB_SERVICE_H_
