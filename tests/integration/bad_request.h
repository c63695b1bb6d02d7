// Helpers of bad_request_test: raw gRPC calls that send what flatshard's own
// clients never build (any request through any stub method, unary or
// server-streaming, with any metadata, answered by its grpc::Status alone),
// and a snapshot of what no refused request may change.
#ifndef FLATSHARD_TESTS_INTEGRATION_BAD_REQUEST_H_
#define FLATSHARD_TESTS_INTEGRATION_BAD_REQUEST_H_

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <google/protobuf/text_format.h>
#include <grpcpp/client_context.h>
#include <grpcpp/support/sync_stream.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

#include "client/flatshard_client.h"
#include "flatshard/v1/membership.grpc.pb.h"
#include "flatshard/v1/worker.grpc.pb.h"

namespace flatshard::testing {

using Metadata = std::vector<std::pair<std::string, std::string>>;

// One row of a bad-request table: the call, the code it must be refused
// with, and a substring its message must hold (the field, or what is wrong).
struct BadRequest {
  std::string name;
  std::function<grpc::Status()> call;
  grpc::StatusCode code;
  std::string message;
};

// A message from its text format ("job: 'a' steps: 0").
template <typename Message>
Message Text(const std::string& text) {
  Message message;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &message)) << text;
  return message;
}

inline void PrepareCall(grpc::ClientContext& context, const Metadata& metadata) {
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  for (const auto& [key, value] : metadata) context.AddMetadata(key, value);
}

// A unary call; its response in `*response` when given.
template <typename Stub, typename Request, typename Response>
grpc::Status RawCall(Stub& stub,
                     grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
                     const Request& request, const Metadata& metadata = {},
                     Response* response = nullptr) {
  grpc::ClientContext context;
  PrepareCall(context, metadata);
  Response ignored;
  return (stub.*method)(&context, request, response != nullptr ? response : &ignored);
}

// A server stream, read to its end.
template <typename Stub, typename Request, typename Response>
grpc::Status RawCall(Stub& stub,
                     std::unique_ptr<grpc::ClientReader<Response>> (Stub::*method)(
                         grpc::ClientContext*, const Request&),
                     const Request& request, const Metadata& metadata = {}) {
  grpc::ClientContext context;
  PrepareCall(context, metadata);
  std::unique_ptr<grpc::ClientReader<Response>> reader = (stub.*method)(&context, request);
  Response response;
  while (reader->Read(&response)) {
  }
  return reader->Finish();
}

// What no refused request may change, as text (a mismatch shows the
// difference): the job, the members (of `spare` its state too; the workers'
// own is their GetStatus), the job's checkpoints, each worker's GetStatus
// (called with `token`, the command token) and the values of `keys` in the
// rendezvous store (read with `session`, a registered worker's).
inline std::string ClusterSnapshot(
    FlatshardClient& client, const std::string& job_name,
    const std::vector<std::unique_ptr<v1::WorkerService::Stub>>& workers, const Metadata& token,
    v1::Membership::Stub& members, const Metadata& session, const std::vector<std::string>& keys,
    const std::string& spare) {
  auto job = client.GetJob(job_name);
  if (!job.ok()) return absl::StrCat("GetJob: ", job.status().ToString());
  std::string out = absl::StrCat(
      "job ", v1::JobState_Name(job->state()), " step ", job->step(), " epoch ", job->epoch(),
      " last_seq ", job->last_seq(), " world ", job->world_size(), " units ", job->units_size(),
      " restarts ", job->restarts(), " training ", job->training().target_step(), " spec ",
      std::hash<std::string>()(job->spec().ShortDebugString()), " settings ",
      job->spec().state_dict_settings().ShortDebugString(), "\n");
  auto listed = client.ListWorkers();
  if (!listed.ok()) return absl::StrCat(out, "ListWorkers: ", listed.status().ToString());
  for (const v1::WorkerInfo& w : *listed) {
    absl::StrAppend(&out, "worker ", w.worker_id(), " rank ", w.rank(), " at ", w.address(),
                    " device ", w.device(), w.worker_id() == spare ? " " + w.state() : "", "\n");
  }
  auto checkpoints = client.ListCheckpoints(job_name);
  if (!checkpoints.ok()) return absl::StrCat(out, "ckpt: ", checkpoints.status().ToString());
  for (const v1::CheckpointInfo& c : *checkpoints) {
    absl::StrAppend(&out, "checkpoint ", c.ShortDebugString(), "\n");
  }
  for (const auto& worker : workers) {
    v1::GetStatusResponse status;
    const grpc::Status s =
        RawCall(*worker, &v1::WorkerService::Stub::GetStatus, {}, token, &status);
    absl::StrAppend(&out, "status ", s.ok() ? status.ShortDebugString() : s.error_message(), "\n");
  }
  for (const std::string& key : keys) {
    v1::StoreGetRequest get;
    get.set_key(key);
    v1::StoreGetResponse value;
    const grpc::Status s = RawCall(members, &v1::Membership::Stub::StoreGet, get, session, &value);
    absl::StrAppend(&out, "store ", key, " = ", s.ok() ? value.value() : s.error_message(), "\n");
  }
  return out;
}

}  // namespace flatshard::testing

#endif  // FLATSHARD_TESTS_INTEGRATION_BAD_REQUEST_H_
