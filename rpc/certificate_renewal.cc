#include "rpc/certificate_renewal.h"

#include <algorithm>
#include <filesystem>
#include <memory>

#include <arpa/inet.h>
#include <openssl/asn1.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "rpc/cluster_certificates.h"
#include "rpc/host_port.h"
#include "rpc/tls_credentials.h"

#include "core/status_macros.h"
#include "storage/durable_file.h"

namespace flatshard {
namespace {

struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct NamesFree {
  void operator()(GENERAL_NAMES* n) const { GENERAL_NAMES_free(n); }
};

std::vector<std::string> SortedUnique(std::vector<std::string> names) {
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

// A name as CertificateHost writes it, or as it is when it is not one (a
// role's name, or what another tool wrote): compared, never issued.
std::string ComparableName(const std::string& name) {
  absl::StatusOr<std::string> host = CertificateHost(name);
  return host.ok() ? *std::move(host) : name;
}

// The names a role's certificate carries for `hosts` (IssueRoleCertificate).
std::vector<std::string> NamesFor(const char* identity, const std::vector<std::string>& hosts) {
  std::vector<std::string> names = {"localhost", "127.0.0.1", "::1", RoleHostName(identity)};
  for (const std::string& host : hosts) names.push_back(ComparableName(host));
  return SortedUnique(std::move(names));
}

// Whether `key_pem` is the private key of `cert_pem` (false when either does
// not parse).
bool IsKeyOf(const std::string& cert_pem, const std::string& key_pem) {
  std::unique_ptr<BIO, BioFree> cert_bio(
      BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size())));
  std::unique_ptr<BIO, BioFree> key_bio(
      BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size())));
  std::unique_ptr<X509, X509Free> cert(
      PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
  std::unique_ptr<EVP_PKEY, KeyFree> key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  const bool matches =
      cert != nullptr && key != nullptr && X509_check_private_key(cert.get(), key.get()) == 1;
  ERR_clear_error();
  return matches;
}

std::string Day(absl::Time t) {
  return absl::FormatTime("%Y-%m-%d %H:%M UTC", t, absl::UTCTimeZone());
}

}  // namespace

absl::StatusOr<CertificateFacts> ReadCertificateFacts(const std::string& cert_pem) {
  std::unique_ptr<BIO, BioFree> bio(
      BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size())));
  std::unique_ptr<X509, X509Free> cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) return absl::InvalidArgumentError("not a PEM certificate");
  CertificateFacts facts;
  char common_name[256] = "";
  if (X509_NAME_get_text_by_NID(X509_get_subject_name(cert.get()), NID_commonName, common_name,
                                sizeof(common_name)) > 0) {
    facts.common_name = common_name;
  }
  std::unique_ptr<GENERAL_NAMES, NamesFree> names(static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(cert.get(), NID_subject_alt_name, nullptr, nullptr)));
  for (int i = 0; names != nullptr && i < sk_GENERAL_NAME_num(names.get()); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(names.get(), i);
    if (name->type == GEN_DNS) {
      const ASN1_STRING* dns = name->d.dNSName;
      facts.names.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(dns)),
                               static_cast<size_t>(ASN1_STRING_length(dns)));
    } else if (name->type == GEN_IPADD) {
      const ASN1_OCTET_STRING* ip = name->d.iPAddress;
      const int length = ASN1_STRING_length(ip);
      char text[INET6_ADDRSTRLEN];
      const int family = length == 4 ? AF_INET : length == 16 ? AF_INET6 : 0;
      if (family != 0 && inet_ntop(family, ASN1_STRING_get0_data(ip), text, sizeof(text))) {
        facts.names.emplace_back(text);
      }
    }
  }
  // Seconds from the epoch to notAfter, by OpenSSL's own calendar.
  ASN1_TIME* epoch = ASN1_TIME_set(nullptr, 0);
  int days = 0;
  int seconds = 0;
  const bool diffed = epoch != nullptr &&
                      ASN1_TIME_diff(&days, &seconds, epoch, X509_get0_notAfter(cert.get())) == 1;
  ASN1_TIME_free(epoch);
  if (!diffed) return absl::InvalidArgumentError("the certificate's notAfter cannot be read");
  facts.not_after = absl::FromUnixSeconds(int64_t{days} * 86400 + seconds);
  return facts;
}

absl::StatusOr<RenewalReport> RenewClusterCertificates(const std::string& directory,
                                                       const RenewalOptions& options) {
  namespace fs = std::filesystem;
  if (!options.all && options.valid_for <= options.expiring_within) {
    return absl::InvalidArgumentError(
        "--days must be more than --within-days: a certificate renewed for less would be renewed "
        "again at every run");
  }
  const auto path = [&](const std::string& name) { return (fs::path(directory) / name).string(); };
  PemCertificate ca;
  ASSIGN_OR_RETURN(ca.cert_pem, ReadFileToString(path("ca.pem")));
  ASSIGN_OR_RETURN(ca.key_pem, ReadFileToString(path("ca-key.pem")));
  ASSIGN_OR_RETURN(const CertificateFacts ca_facts, ReadCertificateFacts(ca.cert_pem));
  RenewalReport report;
  report.ca_not_after = ca_facts.not_after;
  const absl::Time now = absl::Now();
  if (ca_facts.not_after <= now) {
    return absl::FailedPreconditionError(absl::StrCat(
        path("ca.pem"), " expired ", Day(ca_facts.not_after),
        ": nothing it signed is accepted any more; make a new CA with `flatshard certs init` in "
        "another directory"));
  }
  if (!IsKeyOf(ca.cert_pem, ca.key_pem)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path("ca-key.pem"), " is not the key of ", path("ca.pem"),
                     ": what it signed would not verify against the CA"));
  }
  // No certificate outlives its CA: one that ends with it is as renewed as it can be.
  const absl::Duration valid_for = std::min(options.valid_for, ca_facts.not_after - now);
  const auto renewable = [&](absl::Time not_after) {
    return not_after < ca_facts.not_after - absl::Hours(1);
  };
  struct Pending {
    const char* file;
    PemCertificate pem;
    std::string why;
  };
  std::vector<Pending> pending;
  for (const auto& [file, identity] :
       {std::pair{"coordinator", kCoordinatorIdentity}, std::pair{"worker", kWorkerIdentity},
        std::pair{"admin", kAdminIdentity}}) {
    ASSIGN_OR_RETURN(const std::string pem, ReadFileToString(path(absl::StrCat(file, ".pem"))));
    ASSIGN_OR_RETURN(const std::string key, ReadFileToString(path(absl::StrCat(file, "-key.pem"))));
    ASSIGN_OR_RETURN(const CertificateFacts facts, ReadCertificateFacts(pem));
    const bool server = absl::string_view(identity) != kAdminIdentity;
    std::vector<std::string> have;
    for (const std::string& name : facts.names) have.push_back(ComparableName(name));
    have = SortedUnique(std::move(have));
    // Its hosts now are its names but the roles' (IssueRoleCertificate adds its own).
    std::vector<std::string> hosts = options.hosts;
    if (hosts.empty()) {
      for (const std::string& name : have) {
        if (!absl::EndsWith(name, ".invalid")) hosts.push_back(name);
      }
    }
    const std::vector<std::string> want = server ? NamesFor(identity, hosts) : have;
    std::string why;
    if (options.all) {
      why = "was asked for (--all)";
    } else if (!IsKeyOf(pem, key)) {
      why = absl::StrCat("does not match ", file, "-key.pem (a renewal cut short?)");
    } else if (facts.not_after - now < options.expiring_within && renewable(facts.not_after)) {
      why = absl::StrCat(facts.not_after <= now ? "expired " : "expires ", Day(facts.not_after));
    } else if (server && !std::binary_search(have.begin(), have.end(), RoleHostName(identity))) {
      why = absl::StrCat("lacks the name ", RoleHostName(identity));
    } else if (want != have) {
      why = absl::StrCat("names ", absl::StrJoin(have, ","), ", not ", absl::StrJoin(want, ","));
    }
    if (why.empty()) continue;
    ASSIGN_OR_RETURN(
        PemCertificate renewed,
        IssueRoleCertificate(identity, server ? hosts : std::vector<std::string>{}, valid_for, ca));
    pending.push_back({file, std::move(renewed), std::move(why)});
  }
  // Issued all before writing any: a failure to issue changes nothing.
  std::vector<std::string> written;
  for (const Pending& p : pending) {
    if (absl::Status s = WriteCertificatePair(directory, p.file, p.pem, &written); !s.ok()) {
      std::vector<std::string> done;
      for (const RenewedCertificate& r : report.renewed) done.push_back(r.file);
      return absl::Status(s.code(),
                          absl::StrCat(s.message(), done.empty() ? "" : " (renewed before it: ",
                                       absl::StrJoin(done, ", "), done.empty() ? "" : ")"));
    }
    report.renewed.push_back({p.file, p.why});
  }
  return report;
}

}  // namespace flatshard
