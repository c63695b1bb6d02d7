// Security with real processes (issue #12 §6, docs/security.md): a cluster
// under mutual TLS with tokens trains and checkpoints; plaintext clients,
// clients without a certificate or with one from another CA, unknown, missing
// and too-weak tokens are refused with the right code; a worker without proof
// cannot register; a process that is not the coordinator cannot command a
// worker; a stolen worker id cannot take a live worker's seat. Every refusal
// leaves the cluster as it was.
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <grpcpp/create_channel.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "rpc/call_metadata.h"
#include "rpc/cluster_certificates.h"
#include "rpc/secrets.h"

#include "client/child_process.h"
#include "client/cluster_security.h"
#include "client/flatshard_client.h"
#include "client/local_cluster.h"
#include "coordinator/grpc_worker_client.h"
#include "coordinator/service/access_policy.h"
#include "core/job_spec_yaml.h"
#include "flatshard/v1/membership.grpc.pb.h"
#include "storage/spec_files.h"
#include "tests/integration/multiprocess.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void WriteFile(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::shared_ptr<grpc::ChannelCredentials> Credentials(const TlsFiles& files,
                                                      std::string_view server_identity) {
  absl::StatusOr<std::optional<TlsMaterial>> tls = LoadTls(files, TlsRole::kClient);
  EXPECT_TRUE(tls.ok()) << tls.status();
  return ChannelCredentials(tls.ok() && tls->has_value() ? &**tls : nullptr, server_identity);
}

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("security");
    auto security = PrepareClusterSecurity(dir_ + "/security");
    ASSERT_TRUE(security.ok()) << security.status();
    security_ = *std::move(security);
    // More tokens, and a client certificate of this CA that carries no role
    // (its caller is who its token says).
    viewer_token_ = RandomSecret();
    operator_token_ = RandomSecret();
    WriteFile(security_.tokens_file,
              ReadFile(security_.tokens_file) +
                  TokenTable::Line(viewer_token_, "vic", Role::kViewer) + "\n" +
                  TokenTable::Line(operator_token_, "otto", Role::kOperator) + "\n");
    const PemCertificate ca{ReadFile(security_.dir + "/ca.pem"),
                            ReadFile(security_.dir + "/ca-key.pem")};
    auto client = IssueCertificate({"ci-client", {}}, &ca);
    ASSERT_TRUE(client.ok()) << client.status();
    WriteFile(dir_ + "/client.pem", client->cert_pem);
    WriteFile(dir_ + "/client-key.pem", client->key_pem);
    client_tls_ = TlsFiles{dir_ + "/client.pem", dir_ + "/client-key.pem", security_.admin.ca};

    LocalClusterOptions options;
    options.workers = 2;
    options.bin_dir = FLATSHARD_BIN_DIR;
    options.checkpoint_dir = dir_ + "/checkpoints";
    options.coordinator_flags = security_.CoordinatorFlags();
    options.every_worker_flags = security_.WorkerFlags();
    auto cluster = LocalCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    admin_ = std::make_unique<FlatshardClient>(security_.AdminTarget(cluster_->address()));
    auto spec = LoadJobSpecFile(std::string(FLATSHARD_SOURCE_DIR) + "/examples/mlp-job.yaml");
    ASSERT_TRUE(spec.ok()) << spec.status();
    spec->set_world_size(2);
    job_ = spec->name();
    ASSERT_TRUE(admin_->CreateJob(*spec).ok());
    ASSERT_TRUE(admin_->WaitForState(job_, {v1::READY}, absl::Seconds(120)).ok());
  }
  void TearDown() override {
    if (cluster_ != nullptr) {
      EXPECT_TRUE(cluster_->Stop());
    }
  }

  FlatshardClient ClientWithToken(const std::string& token) {
    return FlatshardClient(CoordinatorTarget{cluster_->address(), client_tls_, token, ""});
  }

  std::string dir_;
  ClusterSecurity security_;
  std::string viewer_token_;
  std::string operator_token_;
  TlsFiles client_tls_;
  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<FlatshardClient> admin_;
  std::string job_;
};

TEST_F(SecurityTest, AMutualTlsClusterTrainsAndCheckpointsAndAuditsIt) {
  int steps = 0;
  ASSERT_TRUE(admin_->Train(job_, 3, 0, [&](const v1::StepResult&) { ++steps; }).ok());
  EXPECT_EQ(steps, 3);
  v1::SaveCheckpointRequest save;
  save.set_job(job_);
  save.set_name("secured");
  auto saved = admin_->SaveCheckpoint(save);
  ASSERT_TRUE(saved.ok()) << saved.status();
  // An operator may train, too.
  FlatshardClient op = ClientWithToken(operator_token_);
  // Named by the token it proved, whatever it says of itself; its own words
  // follow, escaped (no forged log line).
  v1::TrainRequest train;
  train.set_job(job_);
  train.set_steps(1);
  train.set_started_by("vic@laptop\naudit who=local-admin");
  ASSERT_TRUE(op.Train(train, [](const v1::StepResult&) {}).ok());
  EXPECT_EQ(admin_->GetJob(job_)->training().started_by(),
            "otto (vic@laptop\\naudit who=local-admin)");
  const std::string audit = ReadFile(security_.dir + "/audit.log");
  EXPECT_THAT(audit, HasSubstr("who=local-admin role=admin"));
  EXPECT_THAT(audit, HasSubstr("call=CreateJob target=mlp-demo result=OK"));
  EXPECT_THAT(audit, HasSubstr("call=SaveCheckpoint target=mlp-demo/secured result=OK"));
  EXPECT_THAT(audit, HasSubstr("who=otto role=operator"));
  // A streaming call is audited when it starts and when it ends, in order.
  const size_t started = audit.find("call=SaveCheckpoint target=mlp-demo/secured result=STARTED");
  ASSERT_NE(started, std::string::npos) << audit;
  EXPECT_LT(started, audit.find("call=SaveCheckpoint target=mlp-demo/secured result=OK"));
  EXPECT_THAT(audit, HasSubstr("call=Train target=mlp-demo result=STARTED"));
  // A unary call has one line.
  EXPECT_THAT(audit, Not(HasSubstr("call=CreateJob target=mlp-demo result=STARTED")));
}

TEST_F(SecurityTest, ClientsWithoutTheRightCredentialsAreRefusedWithTheRightCode) {
  const v1::Job before = *admin_->GetJob(job_);
  // Plaintext, TLS without a client certificate, and a certificate of another CA:
  // the handshake fails, and the message says TLS is needed.
  FlatshardClient plaintext(cluster_->address());
  absl::Status s = plaintext.GetJob(job_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), HasSubstr("it serves TLS"));
  FlatshardClient no_cert(CoordinatorTarget{
      cluster_->address(), {"", "", security_.admin.ca}, security_.admin_token, ""});
  EXPECT_EQ(no_cert.GetJob(job_).status().code(), absl::StatusCode::kUnavailable);
  auto other_ca = IssueCertificate({"other CA", {}, true}, nullptr);
  ASSERT_TRUE(other_ca.ok());
  auto foreign = IssueCertificate({kAdminIdentity, {}}, &*other_ca);
  ASSERT_TRUE(foreign.ok());
  WriteFile(dir_ + "/foreign.pem", foreign->cert_pem);
  WriteFile(dir_ + "/foreign-key.pem", foreign->key_pem);
  WriteFile(dir_ + "/other-ca.pem", other_ca->cert_pem);
  FlatshardClient foreigner(
      CoordinatorTarget{cluster_->address(),
                        {dir_ + "/foreign.pem", dir_ + "/foreign-key.pem", security_.admin.ca},
                        "",
                        ""});
  // Its own files are checked before any call: not signed by the CA given.
  s = foreigner.GetJob(job_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("is not signed by the CA"));
  FlatshardClient foreigner_own_ca(
      CoordinatorTarget{cluster_->address(),
                        {dir_ + "/foreign.pem", dir_ + "/foreign-key.pem", dir_ + "/other-ca.pem"},
                        "",
                        ""});
  EXPECT_EQ(foreigner_own_ca.GetJob(job_).status().code(), absl::StatusCode::kUnavailable);

  // A valid certificate that carries no role: the token decides.
  s = ClientWithToken("").GetJob(job_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(std::string(s.message()), HasSubstr("no credentials"));
  s = ClientWithToken(RandomSecret()).DeleteJob(job_);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(std::string(s.message()), HasSubstr("not in the coordinator's --tokens-file"));
  FlatshardClient viewer = ClientWithToken(viewer_token_);
  EXPECT_TRUE(viewer.GetJob(job_).ok());
  EXPECT_TRUE(viewer.ListWorkers().ok());
  s = viewer.Train(job_, 1, 0, [](const v1::StepResult&) {});
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("Train needs role operator; 'vic' has role viewer"));
  s = ClientWithToken(operator_token_).DeleteJob(job_);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(s.message()), HasSubstr("DeleteJob needs role admin"));
  // The join token is for workers only.
  EXPECT_EQ(ClientWithToken(security_.join_token).GetJob(job_).status().code(),
            absl::StatusCode::kPermissionDenied);

  // Nothing changed, and the refusals of state-changing calls are audited.
  const v1::Job after = *admin_->GetJob(job_);
  EXPECT_EQ(after.state(), before.state());
  EXPECT_EQ(after.step(), before.step());
  EXPECT_EQ(after.epoch(), before.epoch());
  // A caller without a token cannot forge an audit line through the name it sends.
  s = ClientWithToken("").DeleteJob("x result=OK\naudit time=now who=local-admin call=DeleteJob");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated);
  const std::string audit = ReadFile(security_.dir + "/audit.log");
  EXPECT_THAT(audit, HasSubstr("target=x_result=OK\\naudit_time=now_who=local-admin"));
  EXPECT_THAT(audit, Not(HasSubstr("\naudit time=now")));
  EXPECT_THAT(audit, HasSubstr("who=vic role=viewer"));
  EXPECT_THAT(audit, HasSubstr("call=DeleteJob target=mlp-demo result=PERMISSION_DENIED"));
  EXPECT_THAT(audit, HasSubstr("call=DeleteJob target=mlp-demo result=UNAUTHENTICATED"));

  // A caller without a token cannot fill the disk with refusals either: a
  // burst of 100 lines, then 10 a second, and a count of the rest.
  const auto refusal_lines = [this] {
    const std::string text = ReadFile(security_.dir + "/audit.log");
    size_t n = 0;
    for (size_t at = text.find("who=unidentified"); at != std::string::npos;
         at = text.find("who=unidentified", at + 1)) {
      ++n;
    }
    return n;
  };
  const size_t lines_before = refusal_lines();
  const absl::Time flood_began = absl::Now();
  constexpr int kFlood = 400;
  for (int i = 0; i < kFlood; ++i) {
    ASSERT_EQ(ClientWithToken("").DeleteJob(job_).code(), absl::StatusCode::kUnauthenticated);
  }
  const double flood_s = absl::ToDoubleSeconds(absl::Now() - flood_began);
  const size_t written = refusal_lines() - lines_before;
  EXPECT_LE(static_cast<double>(written), 100 + 10 * flood_s + 1) << "in " << flood_s << " s";
  EXPECT_LT(written, static_cast<size_t>(kFlood));
  // The next line written says how many were not (bounded: a refusal every
  // call, a line every 100 ms).
  bool counted = false;
  for (int i = 0; i < 1000 && !counted && absl::Now() - flood_began < absl::Seconds(60); ++i) {
    ASSERT_EQ(ClientWithToken("").DeleteJob(job_).code(), absl::StatusCode::kUnauthenticated);
    counted = absl::StrContains(ReadFile(security_.dir + "/audit.log"), "refusals_not_logged=");
  }
  EXPECT_TRUE(counted);
}

TEST_F(SecurityTest, WorkersJoinOnlyWithProofAndOnlyTheCoordinatorCommandsThem) {
  const std::string worker0 = cluster_->worker_addresses()[0];
  // A worker daemon with no certificate cannot even reach Register.
  auto bare = ChildProcess::Spawn({std::string(FLATSHARD_BIN_DIR) + "/flatshard-worker",
                                   "--coordinator", cluster_->address(), "--state-dir", "",
                                   "--connect-timeout", "3", "--metrics-listen", ""});
  ASSERT_TRUE(bare.ok()) << bare.status();
  std::optional<int> exit_code = (*bare)->Wait(absl::Seconds(30));
  ASSERT_TRUE(exit_code.has_value());
  EXPECT_NE(*exit_code, 0);

  // Register over a TLS channel with a certificate that is not a worker's:
  // a join token is needed, and a viewer's is not one.
  auto membership = v1::Membership::NewStub(
      grpc::CreateChannel(cluster_->address(), Credentials(client_tls_, kCoordinatorIdentity)));
  auto register_as = [&](const std::string& id, const std::string& token,
                         const std::string& secret) {
    grpc::ClientContext context;
    if (!token.empty()) context.AddMetadata(kAuthorizationKey, "Bearer " + token);
    v1::RegisterRequest request;
    request.set_worker_id(id);
    request.set_address("127.0.0.1:9");
    request.set_requested_rank(-1);
    request.set_identity_secret(secret);
    v1::RegisterResponse response;
    return membership->Register(&context, request, &response);
  };
  EXPECT_EQ(register_as("intruder", "", "s").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  grpc::Status weak = register_as("intruder", viewer_token_, "s");
  EXPECT_EQ(weak.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(weak.error_message(), HasSubstr("Register needs role worker"));
  // With the join token, a stolen id of a live worker is still refused: the
  // identity secret is the daemon's own.
  grpc::Status stolen = register_as("worker-0", security_.join_token, "guessed");
  EXPECT_EQ(stolen.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(stolen.error_message(), HasSubstr("belongs to a live worker at " + worker0));
  auto workers = admin_->ListWorkers();
  ASSERT_TRUE(workers.ok());
  ASSERT_EQ(workers->size(), 2u);
  EXPECT_EQ((*workers)[0].address(), worker0);  // the seat is untouched
  // A new worker with the join token is welcome.
  EXPECT_TRUE(register_as("newcomer", security_.join_token, RandomSecret()).ok());

  // Only the coordinator commands a worker: a CA-signed certificate that is
  // not the coordinator's is refused even with the command token, and the
  // coordinator's certificate without the token is refused too.
  GrpcWorkerClient impostor(worker0, Credentials(security_.admin, kWorkerIdentity),
                            cluster_->command_token());
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  absl::Status s = impostor.Abort(0, "forged", deadline);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(s.message()), HasSubstr("only from the coordinator's certificate"));
  v1::ConfigureRequest configure;
  configure.set_job("evil");
  configure.set_job_epoch(99);
  EXPECT_EQ(impostor.Configure(configure, deadline).code(), absl::StatusCode::kPermissionDenied);
  GrpcWorkerClient no_token(worker0, Credentials(security_.coordinator, kWorkerIdentity),
                            RandomSecret());
  EXPECT_EQ(no_token.Abort(0, "forged", deadline).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(no_token.GetStatus(deadline).status().code(), absl::StatusCode::kUnauthenticated);
  v1::CommandBatch batch;
  batch.mutable_control();
  batch.set_job_epoch(1);
  batch.set_seq(1);
  absl::Status executed;
  absl::Notification done;
  no_token.Execute(&batch, deadline, [&](const absl::StatusOr<v1::CommandResult>& r) {
    executed = r.status();
    done.Notify();
  });
  done.WaitForNotification();
  EXPECT_EQ(executed.code(), absl::StatusCode::kUnauthenticated);
  // The worker is as it was: ready, and the job trains on.
  GrpcWorkerClient coordinator(worker0, Credentials(security_.coordinator, kWorkerIdentity),
                               cluster_->command_token());
  auto status = coordinator.GetStatus(deadline);
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->state(), "ready");
  EXPECT_TRUE(admin_->Train(job_, 2, 0, [](const v1::StepResult&) {}).ok());
}

}  // namespace
}  // namespace flatshard
