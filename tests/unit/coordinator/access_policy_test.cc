// Tests coordinator/service/access_policy.h (roles, the tokens file),
// request_limits.h, authenticator.h's audit fields, and that the JobService
// policy table covers every method of the service, so a new RPC cannot be
// added without deciding who may call it.
#include "coordinator/service/access_policy.h"

#include <set>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "google/protobuf/descriptor.h"
#include "rpc/secrets.h"

#include "coordinator/service/authenticator.h"
#include "coordinator/service/guarded_job_service.h"
#include "coordinator/service/request_limits.h"
#include "flatshard/v1/job.grpc.pb.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;

TEST(AccessPolicyTest, RolesNestAndWorkerStandsApart) {
  EXPECT_TRUE(RoleAllows(Role::kAdmin, Role::kOperator));
  EXPECT_TRUE(RoleAllows(Role::kOperator, Role::kViewer));
  EXPECT_FALSE(RoleAllows(Role::kViewer, Role::kOperator));
  EXPECT_FALSE(RoleAllows(Role::kOperator, Role::kAdmin));
  EXPECT_FALSE(RoleAllows(Role::kAdmin, Role::kWorker));
  EXPECT_FALSE(RoleAllows(Role::kWorker, Role::kViewer));
  EXPECT_TRUE(RoleAllows(Role::kWorker, Role::kWorker));
  EXPECT_EQ(*ParseRole("operator"), Role::kOperator);
  EXPECT_THAT(std::string(ParseRole("root").status().message()),
              HasSubstr("role 'root' is not one of viewer, operator, admin, worker"));
}

TEST(AccessPolicyTest, TheTokensFileHoldsDigestsAndIsCheckedLineByLine) {
  const std::string alice = RandomSecret(), bob = RandomSecret();
  auto table =
      TokenTable::Parse("# tokens\n" + TokenTable::Line(alice, "alice", Role::kAdmin) + "\n\n  " +
                            TokenTable::Line(bob, "bob", Role::kViewer) + "  # trailing comment\n",
                        "tokens");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->Find(alice)->name, "alice");
  EXPECT_EQ(table->Find(bob)->role, Role::kViewer);
  EXPECT_EQ(table->Find(RandomSecret()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table->Find("").status().code(), absl::StatusCode::kNotFound);
  // The line stores the digest, never the token.
  EXPECT_EQ(TokenTable::Line(alice, "alice", Role::kAdmin).find(alice), std::string::npos);
  auto bad = [](const std::string& text, const std::string& message) {
    const absl::Status s = TokenTable::Parse(text, "--tokens-file 't'").status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(std::string(s.message()), HasSubstr(message)) << text;
  };
  const std::string digest = Sha256Hex("x");
  bad(digest + " alice", "--tokens-file 't' line 1: expected '<sha256-hex> <name> <role>'");
  bad("\n" + digest + " alice god", "line 2: role 'god' is not one of");
  bad("xyz alice admin", "64 hex digits");
  bad(digest + " a admin\n" + digest + " b viewer", "line 2: the token is listed twice");
  EXPECT_EQ(TokenTable::Load("/nonexistent/tokens").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(AccessPolicyTest, EveryJobServiceMethodHasAPolicy) {
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          "flatshard.v1.JobService");
  ASSERT_NE(service, nullptr);
  std::set<std::string> covered;
  for (const CallPolicy& p : JobServiceCallPolicies()) covered.insert(p.name);
  for (int i = 0; i < service->method_count(); ++i) {
    EXPECT_TRUE(covered.contains(service->method(i)->name()))
        << service->method(i)->name() << " has no access policy";
  }
  EXPECT_EQ(covered.size(), static_cast<size_t>(service->method_count()));
}

TEST(AuditFieldTest, ACallersNameCannotForgeALineOrFillTheDisk) {
  EXPECT_EQ(AuditField(""), "-");
  EXPECT_EQ(AuditField("mlp-demo/step-00000003"), "mlp-demo/step-00000003");
  // A newline and a fake "result=OK" stay inside one escaped token.
  const std::string forged = AuditField("x result=OK\naudit time=now who=alice call=DeleteJob");
  EXPECT_EQ(forged, "x_result=OK\\naudit_time=now_who=alice_call=DeleteJob");
  EXPECT_EQ(forged.find('\n'), std::string::npos);
  EXPECT_EQ(forged.find(' '), std::string::npos);
  const std::string huge = AuditField(std::string(8 << 20, 'a'));
  EXPECT_EQ(huge, std::string(256, 'a') + "...(8388608 bytes)");
  EXPECT_EQ(AuditField(std::string("\x01\xff\"", 3)), "\\x01\\xff\\\"");
}

TEST(RequestLimitsTest, StreamsPerClientAndExpensiveCallsPerMinute) {
  RequestLimits limits({/*max_streams_per_client=*/2, /*expensive_calls_per_minute=*/3});
  {
    auto a = limits.AdmitStream("alice", "Train");
    auto b = limits.AdmitStream("alice", "WatchEvents");
    ASSERT_TRUE(a.ok() && b.ok());
    const absl::Status third = limits.AdmitStream("alice", "WatchEvents").status();
    EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(std::string(third.message()), HasSubstr("streams_per_client (2"));
    EXPECT_TRUE(limits.AdmitStream("bob", "Train").ok());  // another client's own budget
  }
  EXPECT_TRUE(limits.AdmitStream("alice", "Train").ok());  // the slots came back
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(limits.AdmitExpensive("alice", "Plan", t0).ok());
  const absl::Status fourth = limits.AdmitExpensive("alice", "SaveCheckpoint", t0);
  EXPECT_EQ(fourth.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(fourth.message()), HasSubstr("expensive_calls_per_minute (3"));
  EXPECT_TRUE(limits.AdmitExpensive("bob", "Plan", t0).ok());
  // 20 s later one token has come back (3 per minute), and only one.
  EXPECT_TRUE(limits.AdmitExpensive("alice", "Plan", t0 + absl::Seconds(20)).ok());
  EXPECT_FALSE(limits.AdmitExpensive("alice", "Plan", t0 + absl::Seconds(20)).ok());
}

}  // namespace
}  // namespace flatshard
