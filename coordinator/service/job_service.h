// flatshard.v1.JobService over gRPC: what the `flatshard` CLI and
// libflatshard_client ask of the coordinator. Every error is an absl::Status
// mapped one-to-one onto a gRPC code, with a message naming the field or the
// state that made the request fail; a bad request changes nothing.
#ifndef FLATSHARD_COORDINATOR_SERVICE_JOB_SERVICE_H_
#define FLATSHARD_COORDINATOR_SERVICE_JOB_SERVICE_H_

#include "absl/time/time.h"

#include "coordinator/coordinator.h"
#include "flatshard/v1/job.grpc.pb.h"

namespace flatshard {

struct JobServiceOptions {
  // A streaming call (Train, SummonFullParams, WatchEvents) whose client has
  // read nothing for this long while the server waits to write is cancelled
  // (StalledWriteGuard); zero: never.
  absl::Duration stalled_write_timeout = absl::Minutes(1);
};

class JobServiceImpl final : public v1::JobService::Service {
 public:
  explicit JobServiceImpl(Coordinator* coordinator, JobServiceOptions options = {})
      : coordinator_(coordinator), options_(options) {}

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
  Coordinator* coordinator_;
  JobServiceOptions options_;
};

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_SERVICE_JOB_SERVICE_H_
