#include "rpc/tls_credentials.h"

#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string_view>
#include <utility>
#include <vector>

#include <grpcpp/security/auth_context.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include "absl/strings/str_cat.h"
#include "rpc/openssl_handles.h"
#include "spdlog/spdlog.h"

#include "core/status_macros.h"

namespace flatshard {
namespace {

// "--tls-cert file 'x.pem'": how every message names what is wrong.
std::string Named(const char* flag, const std::string& path) {
  return absl::StrCat(flag, " file '", path, "'");
}

// The last OpenSSL error, for the message (and the queue cleared).
std::string OpenSslError() {
  const unsigned long code = ERR_peek_last_error();  // NOLINT(google-runtime-int): OpenSSL's type
  ERR_clear_error();
  if (code == 0) return "not PEM";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

absl::StatusOr<std::string> ReadFile(const char* flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(Named(flag, path), " cannot be read (missing or not permitted)"));
  }
  std::stringstream text;
  text << in.rdbuf();
  if (text.str().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(Named(flag, path), " is empty"));
  }
  return text.str();
}

absl::StatusOr<X509Ptr> ParseCertificate(const char* flag, const std::string& path,
                                         const std::string& pem) {
  X509Ptr cert = ReadPemCertificate(pem);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(Named(flag, path), " holds no PEM certificate: ", OpenSslError()));
  }
  return cert;
}

// Expired and not-yet-valid certificates fail every handshake with an opaque
// error on the other side; say so here instead.
absl::Status CheckValidity(const char* flag, const std::string& path, X509* cert) {
  if (X509_cmp_current_time(X509_get0_notAfter(cert)) <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(Named(flag, path), " has expired"));
  }
  if (X509_cmp_current_time(X509_get0_notBefore(cert)) >= 0) {
    return absl::InvalidArgumentError(absl::StrCat(Named(flag, path), " is not valid yet"));
  }
  return absl::OkStatus();
}

std::string CommonName(X509* cert) {
  char name[256] = {0};
  if (X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, name, sizeof(name)) <
      0) {
    return "";
  }
  return name;
}

absl::Status CheckSignedBy(const TlsFiles& files, X509* cert, X509* ca) {
  OpenSslPtr<X509_STORE> store(X509_STORE_new());
  OpenSslPtr<X509_STORE_CTX> ctx(X509_STORE_CTX_new());
  if (store == nullptr || ctx == nullptr || X509_STORE_add_cert(store.get(), ca) != 1 ||
      X509_STORE_CTX_init(ctx.get(), store.get(), cert, nullptr) != 1) {
    return absl::InternalError(absl::StrCat("cannot check certificates: ", OpenSslError()));
  }
  if (X509_verify_cert(ctx.get()) != 1) {
    const int error = X509_STORE_CTX_get_error(ctx.get());
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat(Named("--tls-cert", files.cert), " is not signed by the CA in ",
                     Named("--tls-ca", files.ca), ": ", X509_verify_cert_error_string(error)));
  }
  return absl::OkStatus();
}

// Checks, after the handshake has verified the chain against the cluster CA,
// that the server's certificate names the role the client dialed, and then
// that it covers the host dialed, as gRPC's default check would. The CA signs
// the coordinator's and the workers' certificates alike, often with the same
// hosts, so without the first check a worker's key could serve as the
// coordinator's (and collect the bearer tokens clients send it).
class ServerIdentityVerifier : public grpc::experimental::ExternalCertificateVerifier {
 public:
  explicit ServerIdentityVerifier(std::string identity) : identity_(std::move(identity)) {}

  bool Verify(grpc::experimental::TlsCustomVerificationCheckRequest* request,
              std::function<void(grpc::Status)> callback, grpc::Status* sync_status) override {
    const grpc::string_ref cn = request->common_name();
    const absl::string_view name(cn.data(), cn.size());
    if (name != identity_) {
      const grpc::string_ref target = request->target_name();
      std::string why =
          absl::StrCat("TLS: the server at ", absl::string_view(target.data(), target.size()),
                       " presented the certificate of '", name, "', not of '", identity_,
                       "': refused before any call was sent");
      // gRPC reports only a failed handshake to the call: the log says why.
      spdlog::error("{}", why);
      *sync_status = grpc::Status(grpc::StatusCode::UNAUTHENTICATED, why);
      return true;
    }
    return host_name_.Verify(request, std::move(callback), sync_status);
  }

  // Both checks finish inside Verify: nothing is pending to cancel.
  void Cancel(grpc::experimental::TlsCustomVerificationCheckRequest* /*request*/) override {}

 private:
  const std::string identity_;
  grpc::experimental::HostNameCertificateVerifier host_name_;
};

}  // namespace

std::string RoleHostName(std::string_view identity) {
  return absl::StrCat(absl::string_view(identity.data(), identity.size()), ".invalid");
}

absl::StatusOr<std::optional<TlsMaterial>> LoadTls(const TlsFiles& files, TlsRole role) {
  if (files.empty()) return std::nullopt;
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError(files.cert.empty() ? "--tls-key is given without --tls-cert"
                                                         : "--tls-cert is given without --tls-key");
  }
  if (role == TlsRole::kServer && files.cert.empty()) {
    return absl::InvalidArgumentError(
        "--tls-ca alone cannot serve TLS: a server needs --tls-cert and --tls-key");
  }
  TlsMaterial tls;
  X509Ptr cert;
  if (!files.cert.empty()) {
    ASSIGN_OR_RETURN(tls.cert_pem, ReadFile("--tls-cert", files.cert));
    ASSIGN_OR_RETURN(tls.key_pem, ReadFile("--tls-key", files.key));
    ASSIGN_OR_RETURN(cert, ParseCertificate("--tls-cert", files.cert, tls.cert_pem));
    RETURN_IF_ERROR(CheckValidity("--tls-cert", files.cert, cert.get()));
    const KeyPtr key = ReadPemPrivateKey(tls.key_pem);
    if (key == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(Named("--tls-key", files.key),
                       " holds no unencrypted PEM private key: ", OpenSslError()));
    }
    if (X509_check_private_key(cert.get(), key.get()) != 1) {
      ERR_clear_error();
      return absl::InvalidArgumentError(absl::StrCat(
          Named("--tls-key", files.key), " is not the key of ", Named("--tls-cert", files.cert)));
    }
    tls.common_name = CommonName(cert.get());
  }
  if (!files.ca.empty()) {
    ASSIGN_OR_RETURN(tls.ca_pem, ReadFile("--tls-ca", files.ca));
    ASSIGN_OR_RETURN(X509Ptr ca, ParseCertificate("--tls-ca", files.ca, tls.ca_pem));
    RETURN_IF_ERROR(CheckValidity("--tls-ca", files.ca, ca.get()));
    if (cert != nullptr) RETURN_IF_ERROR(CheckSignedBy(files, cert.get(), ca.get()));
  }
  return tls;
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const TlsMaterial* tls) {
  if (tls == nullptr) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(
      tls->ca_pem.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = tls->ca_pem;
  options.pem_key_cert_pairs.push_back({tls->key_pem, tls->cert_pem});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const TlsMaterial* tls,
                                                             std::string_view server_identity) {
  if (tls == nullptr) return grpc::InsecureChannelCredentials();
  if (tls->ca_pem.empty()) {
    // The system's roots: a public or company CA names hosts, not our roles.
    grpc::SslCredentialsOptions options;
    options.pem_private_key = tls->key_pem;
    options.pem_cert_chain = tls->cert_pem;
    return grpc::SslCredentials(options);
  }
  namespace tls_api = grpc::experimental;
  std::vector<tls_api::IdentityKeyCertPair> identity;
  if (!tls->cert_pem.empty()) identity.push_back({tls->key_pem, tls->cert_pem});
  tls_api::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(
      std::make_shared<tls_api::StaticDataCertificateProvider>(tls->ca_pem, identity));
  options.watch_root_certs();
  if (!identity.empty()) options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
#ifndef __clang_analyzer__
  // Create `new`s the verifier and hands it to gRPC's core, which deletes it
  // with the credentials. clang-tidy's analyzer cannot follow the hand-over
  // and reports a leak inside gRPC's header, where no NOLINT reaches; it is
  // shown everything else (ASan's leak check runs this path in the tests).
  options.set_certificate_verifier(
      tls_api::ExternalCertificateVerifier::Create<ServerIdentityVerifier>(
          std::string(server_identity)));
#endif
  return tls_api::TlsCredentials(options);
}

std::string PeerCommonName(const grpc::ServerContext& context) {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return "";
  const std::vector<grpc::string_ref> names = auth->FindPropertyValues("x509_common_name");
  if (names.empty()) return "";
  return std::string(names.front().data(), names.front().size());
}

}  // namespace flatshard
