// Tests that a client holding the cluster's CA accepts a server only with the
// role it dialed (rpc/tls_credentials.h ChannelCredentials): the CA signs the
// coordinator's and the workers' certificates alike, and a worker's must not
// serve as the coordinator's. Real gRPC servers on 127.0.0.1 with real
// certificates; a refused handshake must leave the server without a call, so
// the bearer token the client attaches never leaves it.
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "rpc/cluster_certificates.h"
#include "rpc/tls_credentials.h"

#include "flatshard/v1/job.grpc.pb.h"

namespace flatshard {
namespace {

class CountingJobService final : public v1::JobService::Service {
 public:
  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* /*request*/,
                      v1::GetJobResponse* /*response*/) override {
    ++calls;
    if (context->client_metadata().count("authorization") > 0) ++with_token;
    return grpc::Status::OK;
  }
  std::atomic<int> calls{0};
  std::atomic<int> with_token{0};
};

class ServerIdentityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() /
            ("server-identity-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    std::filesystem::remove_all(dir_);
    auto written = WriteClusterCertificates(dir_, {});
    ASSERT_TRUE(written.ok()) << written.status();
    auto admin = LoadTls(Files("admin"), TlsRole::kClient);
    ASSERT_TRUE(admin.ok() && admin->has_value()) << admin.status();
    admin_ = **admin;
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
    std::filesystem::remove_all(dir_);
  }

  std::string Read(const std::string& name) const {
    std::ifstream in(dir_ + "/" + name);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  void Write(const std::string& name, const std::string& text) const {
    std::ofstream(dir_ + "/" + name) << text;
  }
  TlsFiles Files(const std::string& name) const {
    return TlsFiles{dir_ + "/" + name + ".pem", dir_ + "/" + name + "-key.pem", dir_ + "/ca.pem"};
  }

  // Serves the job service on 127.0.0.1 with `files`' certificate, under
  // mutual TLS as the coordinator does; the address.
  std::string Serve(const TlsFiles& files) {
    auto tls = LoadTls(files, TlsRole::kServer);
    EXPECT_TRUE(tls.ok() && tls->has_value()) << tls.status();
    int port = 0;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", ServerCredentials(&**tls), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    EXPECT_NE(port, 0);
    return "127.0.0.1:" + std::to_string(port);
  }

  // One GetJob with a bearer token, as the admin client dialing `identity`.
  grpc::Status Call(const std::string& address, const char* identity,
                    const std::string& host_override = "") {
    grpc::ChannelArguments args;
    if (!host_override.empty()) args.SetSslTargetNameOverride(host_override);
    auto stub = v1::JobService::NewStub(
        grpc::CreateCustomChannel(address, ChannelCredentials(&admin_, identity), args));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    context.AddMetadata("authorization", "Bearer secret-token");
    v1::GetJobRequest request;
    v1::GetJobResponse response;
    return stub->GetJob(&context, request, &response);
  }

  std::string dir_;
  TlsMaterial admin_;
  CountingJobService service_;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(ServerIdentityTest, TheCoordinatorsCertificateIsAcceptedAsTheCoordinators) {
  const std::string address = Serve(Files("coordinator"));
  const grpc::Status status = Call(address, kCoordinatorIdentity);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(service_.with_token.load(), 1);
}

TEST_F(ServerIdentityTest, AWorkersCertificateCannotServeAsTheCoordinators) {
  const std::string address = Serve(Files("worker"));
  const grpc::Status status = Call(address, kCoordinatorIdentity);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_EQ(service_.calls.load(), 0) << "the token reached a server of the wrong role";
  // The same server is the worker it is to a client that dials a worker (as
  // the coordinator does): the refusal is the role, not the handshake.
  EXPECT_TRUE(Call(address, kWorkerIdentity).ok());
  EXPECT_EQ(service_.calls.load(), 1);
}

TEST_F(ServerIdentityTest, TheRightRoleAtAHostItsCertificateDoesNotNameIsRefused) {
  // A coordinator's certificate for another host only: the host the client
  // dialed is still checked beside the role.
  const PemCertificate ca{Read("ca.pem"), Read("ca-key.pem")};
  auto elsewhere = IssueCertificate({kCoordinatorIdentity, {"elsewhere.example"}}, &ca);
  ASSERT_TRUE(elsewhere.ok()) << elsewhere.status();
  Write("elsewhere.pem", elsewhere->cert_pem);
  Write("elsewhere-key.pem", elsewhere->key_pem);
  const std::string address = Serve(Files("elsewhere"));
  const grpc::Status status = Call(address, kCoordinatorIdentity);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_EQ(service_.calls.load(), 0);
  // Dialed by the name it does carry, it is the coordinator.
  EXPECT_TRUE(Call(address, kCoordinatorIdentity, "elsewhere.example").ok());
}

TEST_F(ServerIdentityTest, TheRightRoleAndHostFromAnotherCaIsRefused) {
  // The chain is still verified against the cluster's CA: another CA's
  // certificate with the coordinator's name and this host is no coordinator,
  // even from a server that asks for no client certificate.
  auto other_ca = IssueCertificate({"another CA", {}, true}, nullptr);
  ASSERT_TRUE(other_ca.ok()) << other_ca.status();
  auto forged = IssueRoleCertificate(kCoordinatorIdentity, {}, absl::Hours(24), *other_ca);
  ASSERT_TRUE(forged.ok()) << forged.status();
  Write("forged.pem", forged->cert_pem);
  Write("forged-key.pem", forged->key_pem);
  const std::string address = Serve({dir_ + "/forged.pem", dir_ + "/forged-key.pem", ""});
  const grpc::Status status = Call(address, kCoordinatorIdentity);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_EQ(service_.calls.load(), 0);
}

}  // namespace
}  // namespace flatshard
