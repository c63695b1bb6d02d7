// A WorkerClient that answers every call UNIMPLEMENTED, "not in this test":
// the coordinator's unit-test workers derive from it and override only the
// calls their test makes.
#ifndef FLATSHARD_TESTS_UNIT_COORDINATOR_UNUSED_WORKER_CLIENT_H_
#define FLATSHARD_TESTS_UNIT_COORDINATOR_UNUSED_WORKER_CLIENT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

#include "coordinator/worker_client.h"

namespace flatshard::testing {

class UnusedWorkerClient : public WorkerClient {
 public:
  void Execute(const v1::CommandBatch*, absl::Time, ExecuteDone done) override {
    done(NotInThisTest());
  }
  void CancelAll() override {}
  absl::Status Summon(const v1::CommandBatch&, absl::Time, const ChunkSink&) override {
    return NotInThisTest();
  }
  void JoinSummonAsync(const v1::CommandBatch*, absl::Time, JoinSummonDone done) override {
    done(NotInThisTest());
  }
  void ConfigureAsync(v1::ConfigureRequest, absl::Time, absl::Time, ConfigureDone done) override {
    done(NotInThisTest());
  }
  void AwaitSave(const std::string&, absl::Time, AwaitSaveDone done) override {
    done(NotInThisTest());
  }
  void GetStatusAsync(absl::Time, GetStatusDone done) override { done(NotInThisTest()); }
  void AbortAsync(uint64_t, const std::string&, absl::Time, AbortDone done) override {
    done(NotInThisTest());
  }
  void Disconnect() override {}  // no connection of its own
  std::string address() const override { return "unused"; }

 protected:
  static absl::Status NotInThisTest() { return absl::UnimplementedError("not in this test"); }
};

}  // namespace flatshard::testing

#endif  // FLATSHARD_TESTS_UNIT_COORDINATOR_UNUSED_WORKER_CLIENT_H_
