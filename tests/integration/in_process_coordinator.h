// A coordinator served from the test's own process, as flatshard-coordinator
// serves it (the membership and job services on a loopback gRPC server, its
// state restored, its monitor started), for tests that set what the daemon
// takes no flag for (CoordinatorOptions' hooks) or call into it directly.
// Workers are real daemons the test starts against address(). Stopped in
// the daemon's order: the job first, so the services' long calls return;
// then the server; then the coordinator.
#ifndef FLATSHARD_TESTS_INTEGRATION_IN_PROCESS_COORDINATOR_H_
#define FLATSHARD_TESTS_INTEGRATION_IN_PROCESS_COORDINATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rpc/grpc_server.h"

#include "coordinator/coordinator.h"
#include "coordinator/grpc_worker_client.h"
#include "coordinator/service/job_service.h"
#include "coordinator/service/membership_service.h"
#include "core/status_macros.h"

namespace flatshard::testing {

class InProcessCoordinator {
 public:
  // `options.job.connect` unset: plaintext GrpcWorkerClients carrying each
  // worker's command token.
  static absl::StatusOr<std::unique_ptr<InProcessCoordinator>> Start(CoordinatorOptions options) {
    if (!options.job.connect) {
      options.job.connect = [](const WorkerRecord& w,
                               size_t world_size) -> std::unique_ptr<WorkerClient> {
        return std::make_unique<GrpcWorkerClient>(w.address, nullptr, w.command_token,
                                                  WorkerChannelIdle(world_size));
      };
    }
    std::unique_ptr<InProcessCoordinator> c(new InProcessCoordinator);
    c->coordinator_ = std::make_unique<Coordinator>(options);
    RETURN_IF_ERROR(c->coordinator_->RestoreState());
    c->membership_ = std::make_unique<MembershipService>(
        &c->coordinator_->members(), &c->coordinator_->store(), options.heartbeat_interval);
    c->jobs_ = std::make_unique<JobServiceImpl>(c->coordinator_.get());
    ASSIGN_OR_RETURN(c->server_,
                     GrpcServer::Start("127.0.0.1:0", {c->membership_.get(), c->jobs_.get()}));
    c->coordinator_->Start();
    return c;
  }

  ~InProcessCoordinator() {
    coordinator_->Shutdown("the test ended");
    server_.reset();
    coordinator_.reset();
  }

  Coordinator& coordinator() { return *coordinator_; }
  std::string address() const { return server_->address(); }

 private:
  InProcessCoordinator() = default;

  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<MembershipService> membership_;
  std::unique_ptr<JobServiceImpl> jobs_;
  std::unique_ptr<GrpcServer> server_;
};

}  // namespace flatshard::testing

#endif  // FLATSHARD_TESTS_INTEGRATION_IN_PROCESS_COORDINATOR_H_
