// Tests the absl::Status <-> grpc::Status mapping (proto/grpc_status.h): the
// code and message map one-to-one, and payloads ride in the error details.
// That they cross a real call is tests/integration/configure_abort_test.cc
// (a worker's Configure naming the peer it could not reach).
#include "proto/grpc_status.h"

#include <gtest/gtest.h>

#include "absl/strings/cord.h"

namespace flatshard {
namespace {

TEST(GrpcStatusTest, CodeMessageAndPayloadsSurviveTheRoundTrip) {
  absl::Status failed = absl::UnavailableError("rank 1 could not reach rank 0");
  failed.SetPayload("type.flatshard.dev/a", absl::Cord("0"));
  failed.SetPayload("type.flatshard.dev/b", absl::Cord(std::string("\0\xff", 2)));
  const grpc::Status wire = ToGrpcStatus(failed);
  EXPECT_EQ(wire.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(wire.error_message(), "rank 1 could not reach rank 0");
  const absl::Status back = FromGrpcStatus(wire);
  EXPECT_EQ(back, failed);  // absl compares payloads too
  EXPECT_EQ(back.GetPayload("type.flatshard.dev/b"), absl::Cord(std::string("\0\xff", 2)));
}

TEST(GrpcStatusTest, AStatusWithoutPayloadsSendsNoDetails) {
  const grpc::Status wire = ToGrpcStatus(absl::NotFoundError("no such job"));
  EXPECT_TRUE(wire.error_details().empty());
  EXPECT_EQ(FromGrpcStatus(wire), absl::NotFoundError("no such job"));
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

TEST(GrpcStatusTest, DetailsThatDoNotParseAreDroppedNotTheStatus) {
  const grpc::Status foreign(grpc::StatusCode::INTERNAL, "from another server",
                             std::string("\xff\xff\xff", 3));
  const absl::Status back = FromGrpcStatus(foreign);
  EXPECT_EQ(back.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(back.message(), "from another server");
  int payloads = 0;
  back.ForEachPayload([&payloads](absl::string_view, const absl::Cord&) { ++payloads; });
  EXPECT_EQ(payloads, 0);
}

}  // namespace
}  // namespace flatshard
