#include "rpc/cluster_certificates.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "rpc/host_port.h"
#include "rpc/openssl_handles.h"
#include "rpc/tls_credentials.h"

#include "core/status_macros.h"
#include "storage/durable_file.h"

namespace flatshard {
namespace {

absl::Status OpenSslFailure(const char* what) {
  char text[256] = "unknown error";
  if (const unsigned long code = ERR_get_error(); code != 0) {  // NOLINT(google-runtime-int)
    ERR_error_string_n(code, text, sizeof(text));
  }
  ERR_clear_error();
  return absl::InternalError(absl::StrCat("OpenSSL: ", what, ": ", text));
}

absl::Status AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  OpenSslPtr<X509_EXTENSION> ext(X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str()));
  if (ext == nullptr || X509_add_ext(cert, ext.get(), -1) != 1) {
    return OpenSslFailure("adding an extension");
  }
  return absl::OkStatus();
}

bool IsIpAddress(const std::string& host) {
  unsigned char buffer[16];
  return inet_pton(AF_INET, host.c_str(), buffer) == 1 ||
         inet_pton(AF_INET6, host.c_str(), buffer) == 1;
}

absl::StatusOr<std::string> ToPem(X509* cert) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (PEM_write_bio_X509(bio.get(), cert) != 1) return OpenSslFailure("writing a certificate");
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);  // NOLINT(google-runtime-int)
  return std::string(data, static_cast<size_t>(size));
}

absl::StatusOr<std::string> ToPem(EVP_PKEY* key) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return OpenSslFailure("writing a key");
  }
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);  // NOLINT(google-runtime-int)
  return std::string(data, static_cast<size_t>(size));
}

absl::StatusOr<std::pair<X509Ptr, KeyPtr>> ParseIssuer(const PemCertificate& issuer) {
  X509Ptr cert = ReadPemCertificate(issuer.cert_pem);
  KeyPtr key = ReadPemPrivateKey(issuer.key_pem);
  if (cert == nullptr || key == nullptr) return OpenSslFailure("reading the issuer");
  return std::make_pair(std::move(cert), std::move(key));
}

}  // namespace

absl::StatusOr<PemCertificate> IssueCertificate(const CertificateRequest& request,
                                                const PemCertificate* issuer) {
  KeyPtr key(EVP_EC_gen("P-256"));
  if (key == nullptr) return OpenSslFailure("generating a P-256 key");
  X509Ptr cert(X509_new());
  if (cert == nullptr) return OpenSslFailure("allocating a certificate");
  X509_set_version(cert.get(), 2);  // v3
  // A random 127-bit serial: unique without a serial-number database.
  std::unique_ptr<BIGNUM, decltype(&BN_free)> serial(BN_new(), BN_free);
  if (serial == nullptr || BN_rand(serial.get(), 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) != 1 ||
      BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(cert.get())) == nullptr) {
    return OpenSslFailure("making a serial number");
  }
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), absl::ToInt64Seconds(request.not_before));
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), absl::ToInt64Seconds(request.not_after));
  X509_set_pubkey(cert.get(), key.get());
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("flatshard"), -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(request.common_name.c_str()),
                             -1, -1, 0);
  X509Ptr issuer_cert;
  KeyPtr issuer_key;
  if (issuer != nullptr) {
    ASSIGN_OR_RETURN(auto parsed, ParseIssuer(*issuer));
    issuer_cert = std::move(parsed.first);
    issuer_key = std::move(parsed.second);
  }
  X509* signer = issuer_cert != nullptr ? issuer_cert.get() : cert.get();
  X509_set_issuer_name(cert.get(), X509_get_subject_name(signer));
  if (request.is_ca) {
    RETURN_IF_ERROR(AddExtension(cert.get(), signer, NID_basic_constraints, "critical,CA:TRUE"));
    RETURN_IF_ERROR(
        AddExtension(cert.get(), signer, NID_key_usage, "critical,keyCertSign,cRLSign"));
  } else {
    RETURN_IF_ERROR(AddExtension(cert.get(), signer, NID_basic_constraints, "critical,CA:FALSE"));
    RETURN_IF_ERROR(
        AddExtension(cert.get(), signer, NID_key_usage, "critical,digitalSignature,keyAgreement"));
    // Every flatshard daemon is both a server and a client of another.
    RETURN_IF_ERROR(AddExtension(cert.get(), signer, NID_ext_key_usage, "serverAuth,clientAuth"));
  }
  RETURN_IF_ERROR(AddExtension(cert.get(), signer, NID_subject_key_identifier, "hash"));
  if (!request.hosts.empty()) {
    std::vector<std::string> names;
    for (const std::string& host : request.hosts) {
      const std::string bare = BareHost(host);  // "[::1]" is the IP ::1
      names.push_back(absl::StrCat(IsIpAddress(bare) ? "IP:" : "DNS:", bare));
    }
    RETURN_IF_ERROR(
        AddExtension(cert.get(), signer, NID_subject_alt_name, absl::StrJoin(names, ",")));
  }
  EVP_PKEY* signing_key = issuer_key != nullptr ? issuer_key.get() : key.get();
  if (X509_sign(cert.get(), signing_key, EVP_sha256()) == 0) {
    return OpenSslFailure("signing a certificate");
  }
  PemCertificate out;
  ASSIGN_OR_RETURN(out.cert_pem, ToPem(cert.get()));
  ASSIGN_OR_RETURN(out.key_pem, ToPem(key.get()));
  return out;
}

absl::StatusOr<std::string> CertificateHost(absl::string_view given) {
  std::string host = BareHost(absl::StripAsciiWhitespace(given));
  unsigned char bytes[16];
  char text[INET6_ADDRSTRLEN];
  for (const int family : {AF_INET, AF_INET6}) {
    if (inet_pton(family, host.c_str(), bytes) == 1) {
      return std::string(inet_ntop(family, bytes, text, sizeof(text)));
    }
  }
  // gRPC and OpenSSL compare names without case and without a final dot.
  while (!host.empty() && host.back() == '.') host.pop_back();
  absl::AsciiStrToLower(&host);
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("--hosts: '", given, "' ", why));
  };
  if (host.empty()) return bad("is not a host name");
  for (size_t i = 0; i < host.size(); ++i) {
    const char c = host[i];
    const bool wildcard = c == '*' && i == 0 && host.size() > 2 && host[1] == '.';
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '.' && c != '_' &&
        !wildcard) {
      return bad("is not a host name (letters, digits, '-', '.', a leading '*.') or an IP address");
    }
  }
  if (host == "invalid" || absl::EndsWith(host, ".invalid")) {
    return bad("is in the reserved domain .invalid, which names flatshard's roles");
  }
  return host;
}

absl::StatusOr<PemCertificate> IssueRoleCertificate(const char* identity,
                                                    const std::vector<std::string>& hosts,
                                                    absl::Duration valid_for,
                                                    const PemCertificate& ca) {
  CertificateRequest request{identity, {}};
  request.not_after = valid_for;
  if (absl::string_view(identity) == kAdminIdentity) return IssueCertificate(request, &ca);
  request.hosts = {"localhost", "127.0.0.1", "::1", RoleHostName(identity)};
  for (const std::string& given : hosts) {
    ASSIGN_OR_RETURN(std::string host, CertificateHost(given));
    if (std::find(request.hosts.begin(), request.hosts.end(), host) == request.hosts.end()) {
      request.hosts.push_back(std::move(host));
    }
  }
  return IssueCertificate(request, &ca);
}

absl::Status WriteCertificatePair(const std::string& directory, const std::string& file,
                                  const PemCertificate& pem, std::vector<std::string>* written) {
  namespace fs = std::filesystem;
  const std::string cert = (fs::path(directory) / absl::StrCat(file, ".pem")).string();
  const std::string key = (fs::path(directory) / absl::StrCat(file, "-key.pem")).string();
  // Each file is replaced whole, but the two not at once: a failure between
  // them leaves a key that is not the certificate's, which a daemon refuses
  // at start and RenewClusterCertificates renews on its next run.
  RETURN_IF_ERROR(WriteFileDurably(key, pem.key_pem, 0600));
  RETURN_IF_ERROR(WriteFileDurably(cert, pem.cert_pem, 0644));
  written->push_back(cert);
  written->push_back(key);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> WriteClusterCertificates(
    const std::string& directory, const std::vector<std::string>& hosts, absl::Duration valid_for,
    absl::Duration ca_valid_for) {
  namespace fs = std::filesystem;
  if (fs::exists(fs::path(directory) / "ca.pem")) {
    return absl::AlreadyExistsError(
        absl::StrCat(directory,
                     " already holds a cluster CA (ca.pem); every certificate it signed would "
                     "stop working if it were replaced: choose another directory"));
  }
  std::error_code ec;
  // Made only its owner's: it holds the CA's key.
  if (fs::create_directories(directory, ec)) {
    fs::permissions(directory, fs::perms::owner_all, ec);
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", directory, ": ", ec.message()));
  // No certificate outlives its CA, which renewing cannot extend.
  valid_for = std::min(valid_for, ca_valid_for);
  CertificateRequest ca_request{"flatshard cluster CA", {}, true};
  ca_request.not_after = ca_valid_for;
  ASSIGN_OR_RETURN(PemCertificate ca, IssueCertificate(ca_request, nullptr));
  ASSIGN_OR_RETURN(PemCertificate admin, IssueRoleCertificate(kAdminIdentity, {}, valid_for, ca));
  ASSIGN_OR_RETURN(PemCertificate coordinator,
                   IssueRoleCertificate(kCoordinatorIdentity, hosts, valid_for, ca));
  ASSIGN_OR_RETURN(PemCertificate worker,
                   IssueRoleCertificate(kWorkerIdentity, hosts, valid_for, ca));
  // The CA last: a run that fails halfway leaves no ca.pem, so it can be rerun.
  std::vector<std::string> written;
  RETURN_IF_ERROR(WriteCertificatePair(directory, "admin", admin, &written));
  RETURN_IF_ERROR(WriteCertificatePair(directory, "worker", worker, &written));
  RETURN_IF_ERROR(WriteCertificatePair(directory, "coordinator", coordinator, &written));
  RETURN_IF_ERROR(WriteCertificatePair(directory, "ca", ca, &written));
  return written;
}

}  // namespace flatshard
