// Tests rpc/certificate_renewal.h on real certificate directories made by
// WriteClusterCertificates: what is renewed and why, that the CA and what
// needs nothing stay byte for byte, that renewed certificates load and verify
// against the same CA, and that a failure writes nothing.
#include "rpc/certificate_renewal.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rpc/cluster_certificates.h"
#include "rpc/tls_credentials.h"

namespace flatshard {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::UnorderedElementsAre;

class CertificateRenewalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() /
            ("renewal-test-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    std::filesystem::remove_all(dir_);
    auto written = WriteClusterCertificates(dir_, {"node-a", "10.1.2.3"});
    ASSERT_TRUE(written.ok()) << written.status();
    ca_ = PemCertificate{Read("ca.pem"), Read("ca-key.pem")};
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  static std::string ReadAt(const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  std::string Read(const std::string& name) const { return ReadAt(Path(name)); }
  void Write(const std::string& name, const std::string& text) const {
    std::ofstream(Path(name)) << text;
  }
  // Replaces `file`'s certificate and key by `request`'s, from the same CA.
  void Replace(const std::string& file, const CertificateRequest& request) {
    auto pem = IssueCertificate(request, &ca_);
    ASSERT_TRUE(pem.ok()) << pem.status();
    Write(file + ".pem", pem->cert_pem);
    Write(file + "-key.pem", pem->key_pem);
  }
  // Replaces the directory's CA by one that expired an hour ago.
  PemCertificate PutExpiredCa() const {
    CertificateRequest request{"flatshard cluster CA", {}, true};
    request.not_before = absl::Hours(-48);
    request.not_after = absl::Hours(-1);
    auto expired = IssueCertificate(request, nullptr);
    EXPECT_TRUE(expired.ok()) << expired.status();
    if (!expired.ok()) return {};
    Write("ca.pem", expired->cert_pem);
    Write("ca-key.pem", expired->key_pem);
    return *expired;
  }
  CertificateFacts Facts(const std::string& file) const {
    auto facts = ReadCertificateFacts(Read(file + ".pem"));
    EXPECT_TRUE(facts.ok()) << facts.status();
    return facts.ok() ? *facts : CertificateFacts{};
  }
  std::vector<std::string> Renewed(const RenewalOptions& options) const {
    auto renewed = RenewClusterCertificates(dir_, options);
    EXPECT_TRUE(renewed.ok()) << renewed.status();
    std::vector<std::string> files;
    for (const RenewedCertificate& r :
         renewed.ok() ? renewed->renewed : std::vector<RenewedCertificate>{}) {
      files.push_back(r.file);
    }
    return files;
  }
  void ExpectLoadsAgainstTheCa(const std::string& file) const {
    auto tls =
        LoadTls({Path(file + ".pem"), Path(file + "-key.pem"), Path("ca.pem")}, TlsRole::kServer);
    EXPECT_TRUE(tls.ok()) << file << ": " << tls.status();
    struct stat key {};
    ASSERT_EQ(::stat(Path(file + "-key.pem").c_str(), &key), 0);
    EXPECT_EQ(key.st_mode & 0777, 0600u) << file;
  }

  std::string dir_;
  PemCertificate ca_;
};

TEST_F(CertificateRenewalTest, EachServerCertificateNamesItsRoleAndHostsAndNothingNeedsRenewal) {
  EXPECT_EQ(Facts("coordinator").common_name, kCoordinatorIdentity);
  EXPECT_THAT(Facts("coordinator").names,
              UnorderedElementsAre("localhost", "127.0.0.1", "::1",
                                   RoleHostName(kCoordinatorIdentity), "node-a", "10.1.2.3"));
  EXPECT_THAT(Facts("worker").names, Contains(RoleHostName(kWorkerIdentity)));
  EXPECT_THAT(Facts("worker").names, Not(Contains(RoleHostName(kCoordinatorIdentity))));
  EXPECT_THAT(Facts("admin").names, IsEmpty());
  const absl::Duration left = Facts("admin").not_after - absl::Now();
  EXPECT_GT(left, absl::Hours(24 * 364));
  EXPECT_LT(left, absl::Hours(24 * 366));

  // The roles' domain is no host's: a certificate for it would be a role's.
  const auto reserved =
      WriteClusterCertificates(dir_ + "-reserved", {"FLATSHARD-COORDINATOR.invalid"});
  EXPECT_EQ(reserved.status().code(), absl::StatusCode::kInvalidArgument) << reserved.status();
  EXPECT_FALSE(std::filesystem::exists(dir_ + "-reserved/ca.pem"));
  std::filesystem::remove_all(dir_ + "-reserved");

  const std::string coordinator = Read("coordinator.pem");
  EXPECT_THAT(Renewed({}), IsEmpty());
  // The same hosts, written another way, are the same hosts.
  RenewalOptions same;
  same.hosts = {"node-a", "10.1.2.3", "[::1]", "0:0::1"};
  EXPECT_THAT(Renewed(same), IsEmpty());
  EXPECT_EQ(Read("coordinator.pem"), coordinator);
}

TEST_F(CertificateRenewalTest, HostsAreWrittenAsCompareAndNoneCanTakeARolesName) {
  EXPECT_EQ(*CertificateHost(" Node-A. "), "node-a");
  EXPECT_EQ(*CertificateHost("[0:0::1]"), "::1");
  EXPECT_EQ(*CertificateHost("*.Workers.svc"), "*.workers.svc");
  // Spellings gRPC or OpenSSL would read as a role's name, and non-names.
  for (const char* bad : {"flatshard-coordinator.invalid ", "flatshard-coordinator.invalid.",
                          "FLATSHARD-COORDINATOR.INVALID", "*.invalid.", "invalid", "a b", "",
                          "x.*", "*", "node,a"}) {
    const auto host = CertificateHost(bad);
    EXPECT_EQ(host.status().code(), absl::StatusCode::kInvalidArgument) << "'" << bad << "'";
  }
  const auto made =
      WriteClusterCertificates(dir_ + "-spaced", {" node-a", "flatshard-coordinator.invalid."});
  EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument) << made.status();
  EXPECT_FALSE(std::filesystem::exists(dir_ + "-spaced/ca.pem"));
  std::filesystem::remove_all(dir_ + "-spaced");
  // The same hosts written another way renew nothing, again and again.
  RenewalOptions spaced;
  spaced.hosts = {" NODE-A.", "10.1.2.3 "};
  EXPECT_THAT(Renewed(spaced), IsEmpty());
  RenewalOptions mimic;
  mimic.hosts = {"node-a", "flatshard-coordinator.invalid."};
  mimic.all = true;
  EXPECT_EQ(RenewClusterCertificates(dir_, mimic).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Facts("worker").names, Not(Contains(RoleHostName(kCoordinatorIdentity))));
}

// A renewal cut short between a key and its certificate is repaired by the
// next; a CA key that is not the CA's signs nothing.
TEST_F(CertificateRenewalTest, AKeyThatIsNotItsCertificatesIsRenewedAndAForeignCaKeyRefused) {
  auto other = IssueCertificate({kWorkerIdentity, {"localhost"}}, &ca_);
  ASSERT_TRUE(other.ok()) << other.status();
  Write("worker-key.pem", other->key_pem);
  auto renewed = RenewClusterCertificates(dir_, {});
  ASSERT_TRUE(renewed.ok()) << renewed.status();
  ASSERT_EQ(renewed->renewed.size(), 1u);
  EXPECT_EQ(renewed->renewed[0].file, "worker");
  EXPECT_THAT(renewed->renewed[0].why, HasSubstr("does not match worker-key.pem"));
  ExpectLoadsAgainstTheCa("worker");
  EXPECT_THAT(Facts("worker").names, Contains("node-a"));

  const std::string coordinator = Read("coordinator.pem");
  Write("ca-key.pem", other->key_pem);
  RenewalOptions all;
  all.all = true;
  renewed = RenewClusterCertificates(dir_, all);
  EXPECT_EQ(renewed.status().code(), absl::StatusCode::kFailedPrecondition) << renewed.status();
  EXPECT_THAT(std::string(renewed.status().message()), HasSubstr("is not its key"));
  EXPECT_EQ(Read("coordinator.pem"), coordinator);
}

// The CA lasts ten years and its certificates one; none is made to outlive
// the CA, and one that ends with it is not renewed again and again.
TEST_F(CertificateRenewalTest, NoCertificateOutlivesItsCa) {
  auto report = RenewClusterCertificates(dir_, {});
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_GT(report->ca_not_after - absl::Now(), absl::Hours(24 * 3649));

  const std::string short_lived = dir_ + "-short";
  ASSERT_TRUE(
      WriteClusterCertificates(short_lived, {}, absl::Hours(24 * 365), absl::Hours(24 * 20)).ok());
  auto admin = ReadCertificateFacts(ReadAt(short_lived + "/admin.pem"));
  ASSERT_TRUE(admin.ok()) << admin.status();
  EXPECT_LT(admin->not_after - absl::Now(), absl::Hours(24 * 20) + absl::Minutes(1));
  for (int run = 0; run < 2; ++run) {
    report = RenewClusterCertificates(short_lived, {});
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_THAT(report->renewed, IsEmpty()) << "run " << run;
    EXPECT_LT(report->ca_not_after - absl::Now(), absl::Hours(24 * 20) + absl::Minutes(1));
  }
  RenewalOptions all;
  all.all = true;
  report = RenewClusterCertificates(short_lived, all);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->renewed.size(), 3u);
  admin = ReadCertificateFacts(ReadAt(short_lived + "/admin.pem"));
  EXPECT_LE(admin->not_after, report->ca_not_after);
  std::filesystem::remove_all(short_lived);

  RenewalOptions looping;
  looping.valid_for = absl::Hours(24 * 10);
  EXPECT_EQ(RenewClusterCertificates(dir_, looping).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CertificateRenewalTest, AMissingKeyOrAnotherCasCertificateIsRenewed) {
  std::filesystem::remove(Path("admin-key.pem"));
  auto other_ca = IssueCertificate({"another CA", {}, true}, nullptr);
  ASSERT_TRUE(other_ca.ok()) << other_ca.status();
  auto foreign = IssueRoleCertificate(kWorkerIdentity, {"node-a", "10.1.2.3"},
                                      absl::Hours(24 * 365), *other_ca);
  ASSERT_TRUE(foreign.ok()) << foreign.status();
  Write("worker.pem", foreign->cert_pem);
  Write("worker-key.pem", foreign->key_pem);
  auto report = RenewClusterCertificates(dir_, {});
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->renewed.size(), 2u);
  EXPECT_EQ(report->renewed[0].file, "worker");
  EXPECT_EQ(report->renewed[0].why, "is not signed by ca.pem");
  EXPECT_EQ(report->renewed[1].file, "admin");
  EXPECT_THAT(report->renewed[1].why, HasSubstr("does not match admin-key.pem"));
  ExpectLoadsAgainstTheCa("worker");
  ExpectLoadsAgainstTheCa("admin");
}

// For directories only flatshard uses: a CA that cannot go on is replaced,
// the old kept aside; when the new cannot be written the old comes back.
TEST_F(CertificateRenewalTest, ANewCaIfNeededReplacesAnExpiredOneOrPutsItBack) {
  const PemCertificate expired = PutExpiredCa();
  RenewalOptions options;
  options.new_ca_if_needed = true;

  // A directory every user may write to takes no keys: nothing changes.
  std::filesystem::permissions(dir_, std::filesystem::perms::all);
  auto report = RenewClusterCertificates(dir_, options);
  EXPECT_EQ(report.status().code(), absl::StatusCode::kFailedPrecondition) << report.status();
  EXPECT_THAT(std::string(report.status().message()), HasSubstr("the old one is back"));
  EXPECT_EQ(Read("ca.pem"), expired.cert_pem);
  EXPECT_EQ(Read("ca-key.pem"), expired.key_pem);
  std::filesystem::permissions(dir_, std::filesystem::perms::owner_all);

  report = RenewClusterCertificates(dir_, options);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->renewed.size(), 4u);
  EXPECT_EQ(report->renewed[0].file, "ca");
  EXPECT_THAT(report->renewed[0].why, HasSubstr("expired "));
  EXPECT_EQ(Read("ca.pem.old"), expired.cert_pem);
  EXPECT_GT(report->ca_not_after - absl::Now(), absl::Hours(24 * 3649));
  for (const char* file : {"coordinator", "worker", "admin"}) ExpectLoadsAgainstTheCa(file);
  EXPECT_THAT(Facts("worker").names, Contains("node-a"));  // its hosts kept
  EXPECT_THAT(Renewed({}), IsEmpty());
}

// A new CA written part way (here: the coordinator's key cannot replace a
// directory in its place) puts the old CA back; the certificates the new one
// signed before the failure are renewed from the old by the next run.
TEST_F(CertificateRenewalTest, ANewCaWrittenPartWayLeavesWhatTheNextRunRepairs) {
  const std::string soon = dir_ + "-soon";
  ASSERT_TRUE(
      WriteClusterCertificates(soon, {"node-a"}, absl::Hours(24 * 5), absl::Hours(24 * 10)).ok());
  const std::string old_ca = ReadAt(soon + "/ca.pem");
  std::filesystem::remove(soon + "/coordinator-key.pem");
  std::filesystem::create_directory(soon + "/coordinator-key.pem");
  RenewalOptions options;
  options.new_ca_if_needed = true;
  auto report = RenewClusterCertificates(soon, options);
  ASSERT_FALSE(report.ok());
  EXPECT_THAT(std::string(report.status().message()), HasSubstr("the old one is back"));
  EXPECT_EQ(ReadAt(soon + "/ca.pem"), old_ca);
  EXPECT_FALSE(std::filesystem::exists(soon + "/ca.pem.old"));

  std::filesystem::remove(soon + "/coordinator-key.pem");
  RenewalOptions days;
  days.valid_for = absl::Hours(24 * 5);
  days.expiring_within = absl::Hours(24);
  report = RenewClusterCertificates(soon, days);
  ASSERT_TRUE(report.ok()) << report.status();
  std::vector<std::string> files;
  for (const RenewedCertificate& r : report->renewed) files.push_back(r.file + ": " + r.why);
  EXPECT_THAT(files, UnorderedElementsAre("coordinator: does not match coordinator-key.pem "
                                          "(missing, or a renewal cut short?)",
                                          "worker: is not signed by ca.pem",
                                          "admin: is not signed by ca.pem"));
  for (const char* file : {"coordinator", "worker", "admin"}) {
    const auto tls =
        LoadTls({soon + "/" + file + ".pem", soon + "/" + file + "-key.pem", soon + "/ca.pem"},
                TlsRole::kServer);
    EXPECT_TRUE(tls.ok()) << file << ": " << tls.status();
  }
  std::filesystem::remove_all(soon);
}

// `flatshard up --tls` reuses its directory: one made before the role's name
// went into the server certificates gets them again, with their hosts.
TEST_F(CertificateRenewalTest, ACertificateWithoutItsRolesNameIsRenewedWithItsHosts) {
  Replace("coordinator", {kCoordinatorIdentity, {"localhost", "127.0.0.1", "::1", "node-a"}});
  const std::string worker = Read("worker.pem");
  const std::string admin = Read("admin.pem");

  auto renewed = RenewClusterCertificates(dir_, {});
  ASSERT_TRUE(renewed.ok()) << renewed.status();
  ASSERT_EQ(renewed->renewed.size(), 1u);
  EXPECT_EQ(renewed->renewed[0].file, "coordinator");
  EXPECT_EQ(renewed->renewed[0].why, "lacks the name flatshard-coordinator.invalid");
  EXPECT_THAT(Facts("coordinator").names,
              UnorderedElementsAre("localhost", "127.0.0.1", "::1",
                                   RoleHostName(kCoordinatorIdentity), "node-a"));
  ExpectLoadsAgainstTheCa("coordinator");
  EXPECT_EQ(Read("ca.pem"), ca_.cert_pem);
  EXPECT_EQ(Read("ca-key.pem"), ca_.key_pem);
  EXPECT_EQ(Read("worker.pem"), worker);
  EXPECT_EQ(Read("admin.pem"), admin);
  EXPECT_THAT(Renewed({}), IsEmpty());
}

TEST_F(CertificateRenewalTest, ACertificateThatExpiresSoonIsRenewed) {
  CertificateRequest soon{kAdminIdentity, {}};
  soon.not_after = absl::Hours(24 * 10);
  Replace("admin", soon);
  RenewalOptions within_five_days;
  within_five_days.expiring_within = absl::Hours(24 * 5);
  EXPECT_THAT(Renewed(within_five_days), IsEmpty());

  auto renewed = RenewClusterCertificates(dir_, {});
  ASSERT_TRUE(renewed.ok()) << renewed.status();
  ASSERT_EQ(renewed->renewed.size(), 1u);
  EXPECT_EQ(renewed->renewed[0].file, "admin");
  EXPECT_THAT(renewed->renewed[0].why, HasSubstr("expires "));
  EXPECT_GT(Facts("admin").not_after - absl::Now(), absl::Hours(24 * 364));
  EXPECT_EQ(Facts("admin").common_name, kAdminIdentity);
  ExpectLoadsAgainstTheCa("admin");

  CertificateRequest expired{kWorkerIdentity,
                             {"localhost", "127.0.0.1", "::1", RoleHostName(kWorkerIdentity)}};
  expired.not_before = absl::Hours(-48);
  expired.not_after = absl::Hours(-24);
  Replace("worker", expired);
  renewed = RenewClusterCertificates(dir_, {});
  ASSERT_TRUE(renewed.ok()) << renewed.status();
  ASSERT_EQ(renewed->renewed.size(), 1u);
  EXPECT_THAT(renewed->renewed[0].why, HasSubstr("expired "));
  ExpectLoadsAgainstTheCa("worker");
}

TEST_F(CertificateRenewalTest, OtherHostsRenewTheServersCertificatesAndAllRenewsEveryOne) {
  RenewalOptions moved;
  moved.hosts = {"node-b"};
  EXPECT_THAT(Renewed(moved), ElementsAre("coordinator", "worker"));
  EXPECT_THAT(Facts("worker").names, Contains("node-b"));
  EXPECT_THAT(Facts("worker").names, Not(Contains("node-a")));
  EXPECT_THAT(Facts("worker").names, Contains(RoleHostName(kWorkerIdentity)));
  // Renewed without --hosts again: they keep node-b.
  EXPECT_THAT(Renewed({}), IsEmpty());

  RenewalOptions all;
  all.all = true;
  all.valid_for = absl::Hours(24 * 7);
  EXPECT_THAT(Renewed(all), ElementsAre("coordinator", "worker", "admin"));
  EXPECT_LT(Facts("coordinator").not_after - absl::Now(), absl::Hours(24 * 8));
  EXPECT_THAT(Facts("coordinator").names, Contains("node-b"));
  for (const char* file : {"coordinator", "worker", "admin"}) ExpectLoadsAgainstTheCa(file);
}

TEST_F(CertificateRenewalTest, WithoutTheCasKeyOrWithAnExpiredCaNothingIsWritten) {
  Replace("coordinator", {kCoordinatorIdentity, {"localhost"}});
  const std::string coordinator = Read("coordinator.pem");
  std::filesystem::rename(Path("ca-key.pem"), Path("ca-key.pem.away"));
  auto renewed = RenewClusterCertificates(dir_, {});
  EXPECT_EQ(renewed.status().code(), absl::StatusCode::kNotFound) << renewed.status();
  EXPECT_THAT(std::string(renewed.status().message()), HasSubstr("ca-key.pem"));
  EXPECT_EQ(Read("coordinator.pem"), coordinator);
  std::filesystem::rename(Path("ca-key.pem.away"), Path("ca-key.pem"));

  const PemCertificate expired = PutExpiredCa();
  renewed = RenewClusterCertificates(dir_, {});
  EXPECT_EQ(renewed.status().code(), absl::StatusCode::kFailedPrecondition) << renewed.status();
  EXPECT_THAT(std::string(renewed.status().message()), HasSubstr("certs init"));
  EXPECT_EQ(Read("coordinator.pem"), coordinator);
}

}  // namespace
}  // namespace flatshard
