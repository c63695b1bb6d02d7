// A WorkerClient that passes every call on to another: the base of the
// decorators that change one call and forward the rest (a bench that keeps
// a copy of a batch, a test that holds the waits for async saves). A new
// WorkerClient method gets its forwarding here once, not in each of them.
#ifndef FLATSHARD_COORDINATOR_FORWARDING_WORKER_CLIENT_H_
#define FLATSHARD_COORDINATOR_FORWARDING_WORKER_CLIENT_H_

#include <memory>
#include <string>
#include <utility>

#include "coordinator/worker_client.h"

namespace flatshard {

class ForwardingWorkerClient : public WorkerClient {
 public:
  explicit ForwardingWorkerClient(std::unique_ptr<WorkerClient> inner) : inner_(std::move(inner)) {}

  void Execute(const v1::CommandBatch* batch, absl::Time deadline, ExecuteDone done) override {
    inner_->Execute(batch, deadline, std::move(done));
  }
  void CancelAll() override { inner_->CancelAll(); }
  void ConfigureAsync(v1::ConfigureRequest request, absl::Time connect_by, absl::Time deadline,
                      ConfigureDone done) override {
    inner_->ConfigureAsync(std::move(request), connect_by, deadline, std::move(done));
  }
  absl::Status Summon(const v1::CommandBatch& batch, absl::Time deadline,
                      const ChunkSink& sink) override {
    return inner_->Summon(batch, deadline, sink);
  }
  void JoinSummonAsync(const v1::CommandBatch* batch, absl::Time deadline,
                       JoinSummonDone done) override {
    inner_->JoinSummonAsync(batch, deadline, std::move(done));
  }
  void AwaitSave(const std::string& directory, absl::Time deadline, AwaitSaveDone done) override {
    inner_->AwaitSave(directory, deadline, std::move(done));
  }
  void GetStatusAsync(absl::Time deadline, GetStatusDone done) override {
    inner_->GetStatusAsync(deadline, std::move(done));
  }
  void AbortAsync(uint64_t epoch, const std::string& reason, absl::Time deadline,
                  AbortDone done) override {
    inner_->AbortAsync(epoch, reason, deadline, std::move(done));
  }
  void Disconnect() override { inner_->Disconnect(); }
  std::string address() const override { return inner_->address(); }

 private:
  std::unique_ptr<WorkerClient> inner_;
};

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_FORWARDING_WORKER_CLIENT_H_
