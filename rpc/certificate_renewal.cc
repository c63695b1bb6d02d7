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

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "rpc/cluster_certificates.h"
#include "rpc/host_port.h"
#include "rpc/openssl_handles.h"
#include "rpc/tls_credentials.h"

#include "core/status_macros.h"
#include "storage/durable_file.h"

namespace flatshard {
namespace {

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
  const X509Ptr cert = ReadPemCertificate(cert_pem);
  const KeyPtr key = ReadPemPrivateKey(key_pem);
  const bool matches =
      cert != nullptr && key != nullptr && X509_check_private_key(cert.get(), key.get()) == 1;
  ERR_clear_error();
  return matches;
}

std::string Day(absl::Time t) {
  return absl::FormatTime("%Y-%m-%d %H:%M UTC", t, absl::UTCTimeZone());
}

// Whether `cert_pem` bears `ca`'s signature (false when it does not parse).
bool IsSignedBy(const std::string& cert_pem, X509* ca) {
  const X509Ptr cert = ReadPemCertificate(cert_pem);
  const bool signed_by = cert != nullptr && X509_verify(cert.get(), X509_get0_pubkey(ca)) == 1;
  ERR_clear_error();
  return signed_by;
}

// The hosts `cert_pem` names that a role certificate may name (its role's
// and anything CertificateHost refuses dropped); none when it does not parse.
std::vector<std::string> HostsOf(const std::string& cert_pem) {
  std::vector<std::string> hosts;
  absl::StatusOr<CertificateFacts> facts = ReadCertificateFacts(cert_pem);
  if (!facts.ok()) return hosts;
  for (const std::string& name : facts->names) {
    if (absl::StatusOr<std::string> host = CertificateHost(name); host.ok()) {
      hosts.push_back(*std::move(host));
    }
  }
  return hosts;
}

// A file's contents, or "" when it is missing: a missing key is renewed like
// a wrong one.
absl::StatusOr<std::string> ReadIfPresent(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (absl::IsNotFound(text.status())) return std::string();
  return text;
}

// A new CA and every certificate from it, the old CA's two files kept as
// ca.pem.old and ca-key.pem.old (one generation: an older .old is replaced)
// and put back when the new ones cannot all be written (then each
// certificate already written is not the restored CA's, and the next renewal
// renews it).
absl::StatusOr<RenewalReport> ReplaceCa(const std::string& directory, const RenewalOptions& options,
                                        const std::string& why) {
  namespace fs = std::filesystem;
  const auto path = [&](const std::string& name) { return (fs::path(directory) / name).string(); };
  std::vector<std::string> hosts = options.hosts;
  if (hosts.empty()) {
    ASSIGN_OR_RETURN(const std::string coordinator, ReadIfPresent(path("coordinator.pem")));
    hosts = HostsOf(coordinator);
  }
  for (const std::string& host : hosts) RETURN_IF_ERROR(CertificateHost(host).status());
  // Each rename that happened is undone, and only those; what could not be
  // undone is said, since the message must not claim the old CA is back.
  std::vector<std::string> moved;
  const auto put_back = [&]() -> std::string {
    std::string failed;
    for (const std::string& file : moved) {
      std::error_code back;
      fs::rename(path(file + ".old"), path(file), back);
      if (back) {
        absl::StrAppend(&failed, "; ", file, ".old could not be put back: ", back.message());
      }
    }
    return failed;
  };
  for (const char* name : {"ca.pem", "ca-key.pem"}) {
    const std::string file = name;
    std::error_code ec;
    fs::rename(path(file), path(file + ".old"), ec);
    if (ec) {
      const std::string failed = put_back();
      return absl::InternalError(
          absl::StrCat("cannot move ", path(file), " aside: ", ec.message(), failed));
    }
    moved.push_back(file);
  }
  absl::StatusOr<std::vector<std::string>> written =
      WriteClusterCertificates(directory, hosts, options.valid_for);
  if (!written.ok()) {
    const std::string failed = put_back();
    return absl::Status(
        written.status().code(),
        absl::StrCat("a new CA for one that ", why, " could not be written (",
                     written.status().message(), "); ",
                     failed.empty() ? "the old one is back" : "the old one is in ca.pem.old",
                     failed));
  }
  ASSIGN_OR_RETURN(const std::string ca_pem, ReadFileToString(path("ca.pem")));
  ASSIGN_OR_RETURN(const CertificateFacts ca_facts, ReadCertificateFacts(ca_pem));
  RenewalReport report;
  report.ca_not_after = ca_facts.not_after;
  report.renewed.push_back(
      {"ca", absl::StrCat(why, ": a new CA replaced it (the old one: ca.pem.old)")});
  for (const char* file : {"coordinator", "worker", "admin"}) {
    report.renewed.push_back({file, "is signed by the new CA"});
  }
  return report;
}

}  // namespace

absl::StatusOr<CertificateFacts> ReadCertificateFacts(const std::string& cert_pem) {
  const X509Ptr cert = ReadPemCertificate(cert_pem);
  if (cert == nullptr) {
    ERR_clear_error();  // else a later OpenSSL failure would be reported with this reason
    return absl::InvalidArgumentError("not a PEM certificate");
  }
  CertificateFacts facts;
  char common_name[256] = "";
  if (X509_NAME_get_text_by_NID(X509_get_subject_name(cert.get()), NID_commonName, common_name,
                                sizeof(common_name)) > 0) {
    facts.common_name = common_name;
  }
  OpenSslPtr<GENERAL_NAMES> names(static_cast<GENERAL_NAMES*>(
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
  if (options.new_ca_if_needed && options.expiring_within >= absl::Hours(24 * 365)) {
    return absl::InvalidArgumentError(
        "--within-days must be under a year with --new-ca-if-needed: a CA is replaced when it "
        "ends within it");
  }
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
  const X509Ptr ca_cert = ReadPemCertificate(ca.cert_pem);
  const absl::Time now = absl::Now();
  // Why this CA cannot go on signing; empty when it can.
  std::string unfit;
  if (ca_facts.not_after <= now) {
    unfit = absl::StrCat("expired ", Day(ca_facts.not_after));
  } else if (!IsKeyOf(ca.cert_pem, ca.key_pem)) {
    unfit = "has a ca-key.pem that is not its key";
  } else if (options.new_ca_if_needed && ca_facts.not_after - now < options.expiring_within) {
    unfit = absl::StrCat("expires ", Day(ca_facts.not_after));
  }
  if (!unfit.empty()) {
    if (options.new_ca_if_needed) return ReplaceCa(directory, options, unfit);
    return absl::FailedPreconditionError(
        absl::StrCat(path("ca.pem"), " ", unfit,
                     ": nothing it signs would be accepted; make a new CA (`flatshard certs renew "
                     "--new-ca-if-needed`, or `certs init` in another directory)"));
  }
  RenewalReport report;
  report.ca_not_after = ca_facts.not_after;
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
    ASSIGN_OR_RETURN(const std::string key, ReadIfPresent(path(absl::StrCat(file, "-key.pem"))));
    ASSIGN_OR_RETURN(const CertificateFacts facts, ReadCertificateFacts(pem));
    const bool server = absl::string_view(identity) != kAdminIdentity;
    std::vector<std::string> have;
    for (const std::string& name : facts.names) have.push_back(ComparableName(name));
    have = SortedUnique(std::move(have));
    // Its hosts now are the names it may keep (a name CertificateHost
    // refuses, such as an old spelling of a role's, is dropped: a renewal).
    const std::vector<std::string> hosts = options.hosts.empty() ? HostsOf(pem) : options.hosts;
    const std::vector<std::string> want = server ? NamesFor(identity, hosts) : have;
    std::string why;
    if (options.all) {
      why = "was asked for (--all)";
    } else if (!IsKeyOf(pem, key)) {
      why = absl::StrCat("does not match ", file, "-key.pem (missing, or a renewal cut short?)");
    } else if (!IsSignedBy(pem, ca_cert.get())) {
      why = "is not signed by ca.pem";
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
