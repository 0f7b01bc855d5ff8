// TLS credentials from PEM files (checked with OpenSSL so that errors name
// the file) and the shared bearer token.
#include "proto/security.h"

#include <arpa/inet.h>
#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/sha.h>
#include <openssl/x509.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace dp {
namespace {

absl::Status ConfigError(absl::string_view flag, const std::string& path,
                         absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, " ", path, ": ", what));
}

// The newest OpenSSL error as text ("" when there is none), clearing the
// queue.
std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return absl::StrCat(" (", buf, ")");
}

absl::StatusOr<std::string> ReadFlagFile(absl::string_view flag,
                                         const std::string& path) {
  auto contents = ReadFile(path);
  if (!contents.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, ": cannot read ", path, ": ", contents.status().message()));
  }
  if (contents->size() > (1 << 20)) {
    return ConfigError(flag, path, "larger than 1 MiB: not a PEM file");
  }
  return contents;
}

struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using X509Ptr = std::unique_ptr<X509, X509Deleter>;

std::unique_ptr<BIO, BioDeleter> MemBio(const std::string& pem) {
  return std::unique_ptr<BIO, BioDeleter>(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// Every certificate of a PEM file; an error naming the file when there is
// none or one is malformed.
absl::StatusOr<std::vector<X509Ptr>> ParseCertificates(absl::string_view flag,
                                                       const std::string& path,
                                                       const std::string& pem) {
  std::vector<X509Ptr> certs;
  auto bio = MemBio(pem);
  ERR_clear_error();
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    certs.emplace_back(x);
  }
  // The loop ends with "no start line" at the end of the file; anything else
  // is a malformed certificate.
  const unsigned long e = ERR_peek_last_error();
  if (e != 0 && ERR_GET_REASON(e) != PEM_R_NO_START_LINE) {
    return ConfigError(flag, path,
                       "malformed PEM certificate" + OpenSslError());
  }
  ERR_clear_error();
  if (certs.empty()) {
    return ConfigError(flag, path,
                       "no PEM certificate (-----BEGIN CERTIFICATE-----)");
  }
  return certs;
}

// Says so in the log when `cert` is outside its validity period: peers
// will refuse it, but whether this is wrong depends on the clocks, so it
// is not a configuration error.
void WarnIfNotValidNow(absl::string_view flag, const std::string& path,
                       X509* cert) {
  if (X509_cmp_current_time(X509_get0_notAfter(cert)) < 0) {
    Log("warning: --%s %s: the certificate has expired; peers will refuse "
        "it",
        flag, path);
  } else if (X509_cmp_current_time(X509_get0_notBefore(cert)) > 0) {
    Log("warning: --%s %s: the certificate is not valid yet; peers will "
        "refuse it",
        flag, path);
  }
}

struct KeyPair {
  std::string cert_pem;
  std::string key_pem;
};

// Reads --tls_cert and --tls_key and checks that the key belongs to the
// (first) certificate.
absl::StatusOr<KeyPair> LoadKeyPair(const SecurityFlags& f) {
  KeyPair pair;
  ASSIGN_OR_RETURN(pair.cert_pem, ReadFlagFile("tls_cert", f.tls_cert));
  ASSIGN_OR_RETURN(pair.key_pem, ReadFlagFile("tls_key", f.tls_key));
  ASSIGN_OR_RETURN(std::vector<X509Ptr> certs,
                   ParseCertificates("tls_cert", f.tls_cert, pair.cert_pem));
  WarnIfNotValidNow("tls_cert", f.tls_cert, certs.front().get());
  auto bio = MemBio(pair.key_pem);
  ERR_clear_error();
  std::unique_ptr<EVP_PKEY, KeyDeleter> key(
      PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    return ConfigError("tls_key", f.tls_key,
                       "not an unencrypted PEM private key" + OpenSslError());
  }
  if (X509_check_private_key(certs.front().get(), key.get()) != 1) {
    ERR_clear_error();
    return ConfigError(
        "tls_key", f.tls_key,
        absl::StrCat(
            "the key does not belong to the certificate in --tls_cert ",
            f.tls_cert));
  }
  return pair;
}

absl::StatusOr<std::string> LoadCa(const SecurityFlags& f) {
  ASSIGN_OR_RETURN(std::string pem, ReadFlagFile("tls_ca", f.tls_ca));
  RETURN_IF_ERROR(ParseCertificates("tls_ca", f.tls_ca, pem).status());
  return pem;
}

absl::StatusOr<std::string> LoadToken(const SecurityFlags& f) {
  if (f.auth_token_file.empty()) return std::string();
  return ReadAuthToken(f.auth_token_file);
}

// What both sides load alike: the token, and --tls_cert and --tls_key
// checked to name one key pair (both or neither).
absl::StatusOr<std::string> LoadTokenOfPairedFlags(const SecurityFlags& f) {
  ASSIGN_OR_RETURN(std::string token, LoadToken(f));
  if (f.tls_cert.empty() != f.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key go together: give both or neither");
  }
  return token;
}

}  // namespace

void AddSecurityFlags(Flags* flags, SecurityFlags* values, Side side) {
  const bool server = side == Side::kServer;
  flags->AddString("tls_cert", &values->tls_cert,
                   server ? "PEM certificate chain of dp-ps; with --tls_key "
                            "turns on TLS"
                          : "PEM client certificate presented to dp-ps "
                            "(needed when dp-ps has --tls_ca); with --tls_key "
                            "turns on TLS");
  flags->AddString("tls_key", &values->tls_key,
                   "PEM private key of --tls_cert");
  flags->AddString("tls_ca", &values->tls_ca,
                   server ? "PEM CA bundle: when given, every client must "
                            "present a certificate it signed (mTLS)"
                          : "PEM CA bundle that verifies dp-ps's certificate "
                            "(empty: the system's roots); it or --tls_cert "
                            "turns on TLS");
  flags->AddString("auth_token_file", &values->auth_token_file,
                   server ? "file with the shared token every call must carry"
                          : "file with the shared token sent with every call");
  if (!server) {
    flags->AddString("tls_server_name", &values->tls_server_name,
                     "name dp-ps's certificate must carry, when it differs "
                     "from the host of --ps");
  }
}

std::string ServerSecurity::Describe() const {
  std::string s = mutual_tls ? "mTLS (client certificates required)"
                  : tls      ? "TLS (no client certificates)"
                             : "plaintext";
  absl::StrAppend(&s, auth_token.empty() ? ", no token" : ", token required");
  return s;
}

absl::StatusOr<ServerSecurity> LoadServerSecurity(const SecurityFlags& f) {
  ServerSecurity security;
  ASSIGN_OR_RETURN(security.auth_token, LoadTokenOfPairedFlags(f));
  if (!f.tls_ca.empty() && f.tls_cert.empty()) {
    return absl::InvalidArgumentError(
        "--tls_ca (verify client certificates) needs TLS: give --tls_cert "
        "and --tls_key too");
  }
  if (f.tls_cert.empty()) {
    security.credentials = grpc::InsecureServerCredentials();
    return security;
  }
  ASSIGN_OR_RETURN(KeyPair pair, LoadKeyPair(f));
  std::string ca;
  if (!f.tls_ca.empty()) {
    ASSIGN_OR_RETURN(ca, LoadCa(f));
  }
  grpc::SslServerCredentialsOptions options(
      ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                 : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = ca;
  options.pem_key_cert_pairs.push_back({pair.key_pem, pair.cert_pem});
  security.credentials = grpc::SslServerCredentials(options);
  security.tls = true;
  security.mutual_tls = !ca.empty();
  return security;
}

std::string ClientSecurity::Describe() const {
  std::string s = tls ? "TLS" : "plaintext";
  if (!server_name.empty())
    absl::StrAppend(&s, " (server name ", server_name, ")");
  absl::StrAppend(&s, auth_token.empty() ? ", no token" : ", token");
  return s;
}

absl::StatusOr<ClientSecurity> LoadClientSecurity(const SecurityFlags& f) {
  ClientSecurity security;
  ASSIGN_OR_RETURN(security.auth_token, LoadTokenOfPairedFlags(f));
  security.tls = !f.tls_ca.empty() || !f.tls_cert.empty();
  if (!security.tls) {
    if (!f.tls_server_name.empty()) {
      return absl::InvalidArgumentError(
          "--tls_server_name needs TLS: give --tls_ca or --tls_cert");
    }
    security.credentials = grpc::InsecureChannelCredentials();
    return security;
  }
  grpc::SslCredentialsOptions options;
  if (!f.tls_ca.empty()) {
    ASSIGN_OR_RETURN(options.pem_root_certs, LoadCa(f));
  }
  if (!f.tls_cert.empty()) {
    ASSIGN_OR_RETURN(KeyPair pair, LoadKeyPair(f));
    options.pem_cert_chain = std::move(pair.cert_pem);
    options.pem_private_key = std::move(pair.key_pem);
  }
  security.credentials = grpc::SslCredentials(options);
  security.server_name = f.tls_server_name;
  return security;
}

bool IsLoopbackHost(absl::string_view host) {
  if (absl::ConsumePrefix(&host, "[")) {
    if (!absl::ConsumeSuffix(&host, "]")) return false;
  }
  if (absl::EqualsIgnoreCase(host, "localhost")) return true;
  const std::string h(host);
  unsigned char addr[16];
  if (inet_pton(AF_INET, h.c_str(), addr) == 1) return addr[0] == 127;
  if (inet_pton(AF_INET6, h.c_str(), addr) == 1) {
    static const unsigned char kLoopback6[16] = {0, 0, 0, 0, 0, 0, 0, 0,
                                                 0, 0, 0, 0, 0, 0, 0, 1};
    return std::memcmp(addr, kLoopback6, 16) == 0;
  }
  return false;
}

std::optional<std::string> PlaintextWarning(absl::string_view host,
                                            const ServerSecurity& security) {
  if (security.tls || IsLoopbackHost(host)) return std::nullopt;
  return absl::StrFormat(
      "warning: listening on %s without TLS: anyone who can reach this port "
      "can read the weights%s; see docs/security.md (--tls_cert, --tls_key, "
      "--tls_ca)",
      host,
      security.auth_token.empty() ? " and push gradients"
                                  : ", and the token travels in clear text");
}

absl::StatusOr<std::string> ReadAuthToken(const std::string& path) {
  ASSIGN_OR_RETURN(std::string contents, ReadFlagFile("auth_token_file", path));
  absl::string_view token = absl::StripTrailingAsciiWhitespace(contents);
  if (token.size() < kMinTokenBytes || token.size() > kMaxTokenBytes) {
    return ConfigError(
        "auth_token_file", path,
        absl::StrFormat("the token must be %d..%d bytes, got %d",
                        kMinTokenBytes, kMaxTokenBytes, token.size()));
  }
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return ConfigError("auth_token_file", path,
                         "the token must be printable ASCII without spaces "
                         "(one line)");
    }
  }
  struct stat st;
  if (stat(path.c_str(), &st) == 0) {
    if (std::optional<std::string> warning =
            TokenModeWarning(path, st.st_mode, st.st_gid, getegid())) {
      Log("%s", *warning);
    }
  }
  return std::string(token);
}

std::optional<std::string> TokenModeWarning(const std::string& path,
                                            unsigned mode, unsigned file_group,
                                            unsigned own_group) {
  const bool others = (mode & 007) != 0;
  const bool foreign_group = (mode & 070) != 0 && file_group != own_group;
  if (!others && !foreign_group) return std::nullopt;
  return absl::StrFormat(
      "warning: --auth_token_file %s is readable by other users (mode %03o%s); "
      "chmod 600 it",
      path, mode & 0777,
      others ? ""
             : absl::StrCat(", group ", file_group,
                            " is not this "
                            "process's ",
                            own_group));
}

bool ConstantTimeEquals(absl::string_view given, absl::string_view expected) {
  // Comparing digests makes the time independent of where the inputs first
  // differ and of the expected length.
  unsigned char a[SHA256_DIGEST_LENGTH], b[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(given.data()), given.size(), a);
  SHA256(reinterpret_cast<const unsigned char*>(expected.data()),
         expected.size(), b);
  return CRYPTO_memcmp(a, b, sizeof(a)) == 0;
}

TokenChecker::TokenChecker(const std::string& token)
    : expected_(token.empty() ? "" : kBearerPrefix + token) {}

absl::Status TokenChecker::Check(
    const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const {
  if (expected_.empty()) return absl::OkStatus();
  auto [first, last] = metadata.equal_range(kAuthMetadataKey);
  if (first == last) {
    return absl::UnauthenticatedError(
        "this dp-ps requires a token: the call has no 'authorization: Bearer "
        "<token>' metadata (dp-worker --auth_token_file)");
  }
  if (std::next(first) != last) {
    return absl::UnauthenticatedError(
        "the call has more than one 'authorization' metadata entry");
  }
  const absl::string_view given(first->second.data(), first->second.size());
  if (!ConstantTimeEquals(given, expected_)) {
    return absl::UnauthenticatedError(
        "wrong token (compare --auth_token_file of dp-ps and dp-worker)");
  }
  return absl::OkStatus();
}

void AttachToken(const std::string& token, grpc::ClientContext* context) {
  if (!token.empty()) {
    context->AddMetadata(kAuthMetadataKey, kBearerPrefix + token);
  }
}

}  // namespace dp
