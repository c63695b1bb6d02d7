// Tests rpc/tls_credentials.h, rpc/cluster_certificates.h, rpc/secrets.h and
// rpc/listen_policy.h with real certificates made by OpenSSL in a temporary
// directory: every bad file is refused naming the flag and the file.
#include "rpc/tls_credentials.h"

#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "rpc/cluster_certificates.h"
#include "rpc/listen_policy.h"
#include "rpc/secrets.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;

class TlsFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() /
            ("tls-test-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    std::filesystem::remove_all(dir_);
    auto written = WriteClusterCertificates(dir_, {"node-a", "10.1.2.3"});
    ASSERT_TRUE(written.ok()) << written.status();
    ca_ = PemCertificate{Read("ca.pem"), Read("ca-key.pem")};
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  std::string Read(const std::string& name) const {
    std::ifstream in(Path(name));
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  void Write(const std::string& name, const std::string& text) const {
    std::ofstream(Path(name)) << text;
  }
  // A certificate of this CA with the given validity window, as files.
  TlsFiles Issue(const std::string& name, absl::Duration not_before, absl::Duration not_after) {
    CertificateRequest request{name, {"localhost"}};
    request.not_before = not_before;
    request.not_after = not_after;
    auto pem = IssueCertificate(request, &ca_);
    EXPECT_TRUE(pem.ok()) << pem.status();
    Write(name + ".pem", pem->cert_pem);
    Write(name + "-key.pem", pem->key_pem);
    return TlsFiles{Path(name + ".pem"), Path(name + "-key.pem"), Path("ca.pem")};
  }
  absl::Status Load(const TlsFiles& files, TlsRole role = TlsRole::kServer) {
    return LoadTls(files, role).status();
  }

  std::string dir_;
  PemCertificate ca_;
};

TEST_F(TlsFilesTest, TheClusterCertificatesLoadWithTheirIdentities) {
  for (const auto& [name, identity] :
       {std::pair{"coordinator", kCoordinatorIdentity}, std::pair{"worker", kWorkerIdentity},
        std::pair{"admin", kAdminIdentity}}) {
    auto tls = LoadTls(
        {Path(std::string(name) + ".pem"), Path(std::string(name) + "-key.pem"), Path("ca.pem")},
        TlsRole::kServer);
    ASSERT_TRUE(tls.ok()) << tls.status();
    ASSERT_TRUE(tls->has_value());
    EXPECT_EQ((*tls)->common_name, identity);
    EXPECT_FALSE((*tls)->ca_pem.empty());
  }
  // Keys are the owner's only.
  struct stat key {};
  ASSERT_EQ(::stat(Path("worker-key.pem").c_str(), &key), 0);
  EXPECT_EQ(key.st_mode & 0777, 0600u);
  // No flags: plaintext. A client may verify without presenting anything.
  EXPECT_FALSE(LoadTls({}, TlsRole::kServer)->has_value());
  EXPECT_TRUE(LoadTls({"", "", Path("ca.pem")}, TlsRole::kClient).ok());
  // A directory that holds a CA is never overwritten.
  const auto again = WriteClusterCertificates(dir_, {});
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(Read("ca.pem"), ca_.cert_pem);
}

// Under umask 002 (a group of one's own, as Debian and Fedora set up users) a
// new directory would be group-writable; the one made for the CA's key is
// its owner's only, and the keys are written.
TEST_F(TlsFilesTest, TheDirectoryMadeForTheKeysIsTheOwnersUnderAnyUmask) {
  const std::string fresh = dir_ + "-umask002/security";
  const mode_t before = ::umask(002);
  const auto written = WriteClusterCertificates(fresh, {});
  ::umask(before);
  ASSERT_TRUE(written.ok()) << written.status();
  struct stat info {};
  ASSERT_EQ(::stat(fresh.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0700u);
  ASSERT_EQ(::stat((fresh + "/ca-key.pem").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);
  std::filesystem::remove_all(dir_ + "-umask002");
}

TEST_F(TlsFilesTest, BadFilesAreRefusedNamingTheFlagAndTheFile) {
  const TlsFiles good{Path("worker.pem"), Path("worker-key.pem"), Path("ca.pem")};
  auto expect = [&](const TlsFiles& files, const std::string& message,
                    TlsRole role = TlsRole::kServer) {
    const absl::Status s = Load(files, role);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_THAT(std::string(s.message()), HasSubstr(message));
  };
  expect({Path("missing.pem"), good.key, good.ca},
         "--tls-cert file '" + Path("missing.pem") + "' cannot be read");
  Write("garbage.pem", "not a certificate\n");
  expect({Path("garbage.pem"), good.key, good.ca}, "holds no PEM certificate");
  expect({good.cert, Path("garbage.pem"), good.ca}, "--tls-key file '" + Path("garbage.pem"));
  expect({good.cert, Path("admin-key.pem"), good.ca},
         "--tls-key file '" + Path("admin-key.pem") + "' is not the key of --tls-cert");
  expect({good.cert, good.key, Path("garbage.pem")}, "--tls-ca file '" + Path("garbage.pem"));
  expect({good.cert, "", good.ca}, "--tls-cert is given without --tls-key");
  expect({"", "", good.ca}, "a server needs --tls-cert and --tls-key");
  Write("empty.pem", "");
  expect({Path("empty.pem"), good.key, good.ca}, "is empty");
  const TlsFiles expired = Issue("expired", absl::Hours(-48), absl::Hours(-24));
  expect(expired, "--tls-cert file '" + expired.cert + "' has expired");
  const TlsFiles early = Issue("early", absl::Hours(24), absl::Hours(48));
  expect(early, "is not valid yet");
  // Signed by another CA.
  auto other_ca = IssueCertificate({"other CA", {}, true}, nullptr);
  ASSERT_TRUE(other_ca.ok());
  Write("other-ca.pem", other_ca->cert_pem);
  expect({good.cert, good.key, Path("other-ca.pem")},
         "--tls-cert file '" + good.cert + "' is not signed by the CA in --tls-ca file '" +
             Path("other-ca.pem"));
  // A client checks its own files the same way.
  expect({good.cert, good.key, Path("other-ca.pem")}, "is not signed by the CA", TlsRole::kClient);
}

TEST(SecretsTest, RandomDigestAndConstantTimeCompare) {
  const std::string a = RandomSecret(), b = RandomSecret();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_NE(a, b);
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_TRUE(ConstantTimeEquals(a, a));
  EXPECT_FALSE(ConstantTimeEquals(a, b));
  EXPECT_FALSE(ConstantTimeEquals(a, a.substr(1)));
  EXPECT_FALSE(ConstantTimeEquals("", a));
}

TEST(ListenPolicyTest, ReachableAddressesNeedSecurityOrInsecure) {
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.1:7070"));
  EXPECT_TRUE(IsLoopbackAddress("127.5.0.1:0"));
  EXPECT_TRUE(IsLoopbackAddress("localhost:1"));
  EXPECT_TRUE(IsLoopbackAddress("[::1]:7070"));
  EXPECT_FALSE(IsLoopbackAddress("0.0.0.0:7070"));
  EXPECT_FALSE(IsLoopbackAddress("[::]:7070"));
  EXPECT_FALSE(IsLoopbackAddress("10.0.0.5:7070"));
  EXPECT_TRUE(CheckListenExposure("--listen", "127.0.0.1:1", false, "TLS", false).ok());
  EXPECT_TRUE(CheckListenExposure("--listen", "0.0.0.0:1", true, "TLS", false).ok());
  const absl::Status refused = CheckListenExposure("--listen", "0.0.0.0:1", false, "TLS", false);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("--listen 0.0.0.0:1 is reachable"));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("--insecure"));
  EXPECT_TRUE(CheckListenExposure("--listen", "0.0.0.0:1", false, "TLS", true).ok());
}

}  // namespace
}  // namespace flatshard
