#include "rendezvous/security.h"

#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <sys/stat.h>

#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/net.h"
#include "common/launch_env.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace launch {

namespace {

// A certificate chain or key is a few KiB; a CA bundle may be a few hundred.
constexpr size_t kMaxPemBytes = 4 << 20;

// The error of a file given by `flag`, as one line that names the flag.
absl::Status FlagError(const char* flag, const absl::Status& st) {
  return absl::Status(st.code(), absl::StrCat(flag, "=", st.message()));
}

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* flag) {
  auto read = ReadRegularFile(path, kMaxPemBytes, "a PEM file");
  if (!read.ok()) return absl::InvalidArgumentError(FlagError(flag, read.status()).message());
  std::string pem = std::move(*read);
  if (pem.find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(flag, "=", path, ": expected a PEM file"));
  }
  return pem;
}

// gRPC sends the token as metadata, whose values must be printable ASCII (it asserts otherwise).
absl::Status CheckTokenBytes(const std::string& token, const std::string& source) {
  for (size_t i = 0; i < token.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": the token's byte ", i + 1,
                       " is not printable ASCII; expected letters, digits and punctuation"));
    }
  }
  return absl::OkStatus();
}

using Bio = std::unique_ptr<BIO, decltype(&BIO_free)>;
using X509Ptr = std::unique_ptr<X509, decltype(&X509_free)>;
using KeyPtr = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;

Bio MemBio(const std::string& pem) { return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), &BIO_free); }

}  // namespace

absl::Status CheckSecurityFiles(const SecurityOptions& s) {
  if (!s.tls_key_file.empty() && s.tls_cert_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--tls-key=", s.tls_key_file, ": needs --tls-cert"));
  }
  X509Ptr cert(nullptr, &X509_free);
  if (!s.tls_cert_file.empty()) {
    if (s.tls_key_file.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tls-cert=", s.tls_cert_file, ": needs --tls-key (its private key)"));
    }
    ASSIGN_OR_RETURN(std::string pem, ReadPem(s.tls_cert_file, "--tls-cert"));
    cert.reset(PEM_read_bio_X509(MemBio(pem).get(), nullptr, nullptr, nullptr));
    if (!cert) {
      return absl::InvalidArgumentError(absl::StrCat("--tls-cert=", s.tls_cert_file, ": expected a PEM certificate"));
    }
    ASSIGN_OR_RETURN(std::string key_pem, ReadPem(s.tls_key_file, "--tls-key"));
    // No passphrase: OpenSSL's default asks for one on the terminal and waits (an encrypted key).
    pem_password_cb* no_passphrase = [](char*, int, int, void*) { return -1; };
    KeyPtr key(PEM_read_bio_PrivateKey(MemBio(key_pem).get(), nullptr, no_passphrase, nullptr), &EVP_PKEY_free);
    if (!key) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tls-key=", s.tls_key_file, ": expected an unencrypted PEM private key"));
    }
    if (X509_check_private_key(cert.get(), key.get()) != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tls-key=", s.tls_key_file, ": is not the key of --tls-cert=", s.tls_cert_file));
    }
  }
  if (!s.tls_ca_file.empty()) {
    ASSIGN_OR_RETURN(std::string pem, ReadPem(s.tls_ca_file, "--tls-ca"));
    X509Ptr ca(PEM_read_bio_X509(MemBio(pem).get(), nullptr, nullptr, nullptr), &X509_free);
    if (!ca)
      return absl::InvalidArgumentError(absl::StrCat("--tls-ca=", s.tls_ca_file, ": expected a PEM certificate"));
  }
  return absl::OkStatus();
}

bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  // Every byte of the longer string is looked at whatever the contents: no early exit.
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

absl::StatusOr<std::string> LoadToken(const std::string& token_file, const char* env_value) {
  // Sent as gRPC metadata with every call, whose headers gRPC caps at 8 KiB in all.
  auto check_length = [](const std::string& token, const std::string& source) -> absl::Status {
    if (token.size() < 8 || token.size() > kMaxTokenLength) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": a token of ", token.size(), " characters; expected 8 to ", kMaxTokenLength));
    }
    return CheckTokenBytes(token, source);
  };
  if (!token_file.empty()) {
    const std::string source = absl::StrCat("--rdzv-token-file=", token_file);
    auto read = ReadRegularFile(token_file, 64 << 10, "a file whose first line is the token");
    if (!read.ok()) return absl::InvalidArgumentError(FlagError("--rdzv-token-file", read.status()).message());
    const std::string& text = *read;
    std::string token(absl::StripAsciiWhitespace(text.substr(0, text.find('\n'))));
    RETURN_IF_ERROR(check_length(token, source));
    struct stat st;
    if (::stat(token_file.c_str(), &st) == 0 && (st.st_mode & S_IROTH)) {
      spdlog::warn("{}: every user of this machine can read the token (mode {:04o}); expected chmod 600", source,
                   st.st_mode & 07777);
    }
    return token;
  }
  if (env_value && *env_value) {
    std::string token(absl::StripAsciiWhitespace(env_value));
    RETURN_IF_ERROR(check_length(token, kRdzvTokenEnv));
    return token;
  }
  return std::string();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const SecurityOptions& s) {
  if (!s.tls()) return grpc::InsecureServerCredentials();
  if (s.tls_cert_file.empty() || s.tls_key_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key are both needed to serve TLS");
  }
  grpc::SslServerCredentialsOptions opts(s.tls_ca_file.empty()
                                             ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                             : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  auto cert = ReadPem(s.tls_cert_file, "--tls-cert");
  if (!cert.ok()) return cert.status();
  auto key = ReadPem(s.tls_key_file, "--tls-key");
  if (!key.ok()) return key.status();
  pair.cert_chain = *cert;
  pair.private_key = *key;
  opts.pem_key_cert_pairs.push_back(pair);
  if (!s.tls_ca_file.empty()) {
    auto ca = ReadPem(s.tls_ca_file, "--tls-ca");
    if (!ca.ok()) return ca.status();
    opts.pem_root_certs = *ca;
  }
  return grpc::SslServerCredentials(opts);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(const SecurityOptions& s) {
  if (!s.tls()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions opts;
  if (!s.tls_ca_file.empty()) {
    auto ca = ReadPem(s.tls_ca_file, "--tls-ca");
    if (!ca.ok()) return ca.status();
    opts.pem_root_certs = *ca;
  }
  if (!s.tls_cert_file.empty() || !s.tls_key_file.empty()) {
    if (s.tls_cert_file.empty() || s.tls_key_file.empty()) {
      return absl::InvalidArgumentError("--tls-cert and --tls-key go together (a client certificate for mutual TLS)");
    }
    auto cert = ReadPem(s.tls_cert_file, "--tls-cert");
    if (!cert.ok()) return cert.status();
    auto key = ReadPem(s.tls_key_file, "--tls-key");
    if (!key.ok()) return key.status();
    opts.pem_cert_chain = *cert;
    opts.pem_private_key = *key;
  }
  return grpc::SslCredentials(opts);
}

absl::Status CheckListenerIsProtected(const std::string& listen_host, const SecurityOptions& s) {
  if (!s.token.empty() || s.tls() || s.insecure) return absl::OkStatus();
  auto loopback = IsLoopbackHost(listen_host);
  if (loopback.ok() && *loopback) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("refusing to serve the rendezvous on ", listen_host,
                                                    " without protection: give --rdzv-token-file (or ", kRdzvTokenEnv,
                                                    ") or --tls-cert/--tls-key, "
                                                    "or --insecure to accept joins from anyone who can reach it"));
}

}  // namespace launch
