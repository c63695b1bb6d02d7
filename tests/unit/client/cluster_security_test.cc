// Tests client/cluster_security.h, what `flatshard up --tls` prepares in its
// own directory: certificates made once and reused, tokens fresh every
// start, and a CA that expired (or is about to) replaced with everything it
// signed, since nothing it signs would be accepted for long; a write refused
// for another reason never costs the CA.
#include "client/cluster_security.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <gtest/gtest.h>
#include <unistd.h>

#include "rpc/certificate_renewal.h"
#include "rpc/cluster_certificates.h"
#include "rpc/tls_credentials.h"

namespace flatshard {
namespace {

std::string ReadAt(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class ClusterSecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() /
            ("cluster-security-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void ExpectUsable(const ClusterSecurity& s) {
    for (const TlsFiles* files : {&s.coordinator, &s.worker, &s.admin}) {
      const auto tls = LoadTls(*files, TlsRole::kServer);
      EXPECT_TRUE(tls.ok()) << files->cert << ": " << tls.status();
    }
  }

  std::string dir_;
};

TEST_F(ClusterSecurityTest, CertificatesAreMadeOnceAndTokensEveryStart) {
  auto first = PrepareClusterSecurity(dir_);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->renewed.empty());
  ExpectUsable(*first);
  const std::string ca = ReadAt(dir_ + "/ca.pem");
  const std::string coordinator = ReadAt(dir_ + "/coordinator.pem");

  auto second = PrepareClusterSecurity(dir_);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(second->renewed.empty());
  EXPECT_EQ(ReadAt(dir_ + "/ca.pem"), ca);
  EXPECT_EQ(ReadAt(dir_ + "/coordinator.pem"), coordinator);
  EXPECT_NE(second->admin_token, first->admin_token);
  EXPECT_EQ(ReadAt(second->admin_token_file), second->admin_token + "\n");
}

TEST_F(ClusterSecurityTest, ACaThatExpiresSoonIsReplacedWithEverythingItSigned) {
  // A CA with 10 days left, as one made by an earlier flatshard (a year's CA)
  // would be near its end.
  ASSERT_TRUE(WriteClusterCertificates(dir_, {}, absl::Hours(24 * 365), absl::Hours(24 * 10)).ok());
  const std::string old_ca = ReadAt(dir_ + "/ca.pem");
  auto prepared = PrepareClusterSecurity(dir_);
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  ASSERT_EQ(prepared->renewed.size(), 4u);
  EXPECT_EQ(prepared->renewed[0].file, "ca");
  EXPECT_NE(prepared->renewed[0].why.find("expires "), std::string::npos)
      << prepared->renewed[0].why;
  EXPECT_NE(ReadAt(dir_ + "/ca.pem"), old_ca);
  EXPECT_EQ(ReadAt(dir_ + "/ca.pem.old"), old_ca);
  ExpectUsable(*prepared);  // every certificate verifies against the new CA
  auto report = RenewClusterCertificates(dir_, {});
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_GT(report->ca_not_after - absl::Now(), absl::Hours(24 * 3649));

  // A CA key that is not the CA's: replaced too.
  std::filesystem::copy_file(dir_ + "/admin-key.pem", dir_ + "/ca-key.pem",
                             std::filesystem::copy_options::overwrite_existing);
  prepared = PrepareClusterSecurity(dir_);
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  ASSERT_EQ(prepared->renewed.size(), 4u);
  EXPECT_NE(prepared->renewed[0].why.find("is not its key"), std::string::npos)
      << prepared->renewed[0].why;
  ExpectUsable(*prepared);
}

TEST_F(ClusterSecurityTest, ARefusedWriteLeavesTheCaAsItWas) {
  ASSERT_TRUE(PrepareClusterSecurity(dir_).ok());
  const std::string ca = ReadAt(dir_ + "/ca.pem");
  // A worker key that is not the certificate's: it needs renewing, and the
  // CA is fit (so nothing may replace it).
  std::filesystem::copy_file(dir_ + "/admin-key.pem", dir_ + "/worker-key.pem",
                             std::filesystem::copy_options::overwrite_existing);
  // Keys are written only into a directory not every user may write to.
  std::filesystem::permissions(dir_, std::filesystem::perms::all);
  auto prepared = PrepareClusterSecurity(dir_);
  EXPECT_EQ(prepared.status().code(), absl::StatusCode::kFailedPrecondition) << prepared.status();
  EXPECT_EQ(ReadAt(dir_ + "/ca.pem"), ca);
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/ca.pem.old"));

  std::filesystem::permissions(dir_, std::filesystem::perms::owner_all);
  prepared = PrepareClusterSecurity(dir_);
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  ASSERT_EQ(prepared->renewed.size(), 1u);
  EXPECT_EQ(prepared->renewed[0].file, "worker");
  EXPECT_EQ(ReadAt(dir_ + "/ca.pem"), ca);
  ExpectUsable(*prepared);
}

}  // namespace
}  // namespace flatshard
