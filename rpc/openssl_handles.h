// Owning handles for the OpenSSL objects rpc/ makes and reads (certificates,
// keys, memory BIOs, stores, extensions, name lists), and PEM read from
// memory, shared by tls_credentials.cc, cluster_certificates.cc and
// certificate_renewal.cc.
#ifndef FLATSHARD_RPC_OPENSSL_HANDLES_H_
#define FLATSHARD_RPC_OPENSSL_HANDLES_H_

#include <memory>
#include <string>

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

namespace flatshard {

struct OpenSslFree {
  void operator()(BIO* p) const { BIO_free(p); }
  void operator()(X509* p) const { X509_free(p); }
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(X509_STORE* p) const { X509_STORE_free(p); }
  void operator()(X509_STORE_CTX* p) const { X509_STORE_CTX_free(p); }
  void operator()(X509_EXTENSION* p) const { X509_EXTENSION_free(p); }
  void operator()(GENERAL_NAMES* p) const { GENERAL_NAMES_free(p); }
};
template <typename T>
using OpenSslPtr = std::unique_ptr<T, OpenSslFree>;
using BioPtr = OpenSslPtr<BIO>;
using X509Ptr = OpenSslPtr<X509>;
using KeyPtr = OpenSslPtr<EVP_PKEY>;

// A read-only BIO over `text`, which must outlive it.
inline BioPtr MemoryBio(const std::string& text) {
  return BioPtr(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
}

// The first certificate, or unencrypted private key, in `pem`; null when
// there is none (OpenSSL's error queue then says why).
inline X509Ptr ReadPemCertificate(const std::string& pem) {
  const BioPtr bio = MemoryBio(pem);
  return X509Ptr(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
}
inline KeyPtr ReadPemPrivateKey(const std::string& pem) {
  const BioPtr bio = MemoryBio(pem);
  return KeyPtr(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
}

}  // namespace flatshard

#endif  // FLATSHARD_RPC_OPENSSL_HANDLES_H_
