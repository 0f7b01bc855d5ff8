// Who may talk to dp-ps, decided in one place for both binaries: TLS and
// mutual TLS credentials built from PEM files, and the shared bearer token
// sent as call metadata and checked in constant time.
//
// Errors name the flag and the file; the binaries exit with
// kExitConfigError on them.
#ifndef DP_PROTO_SECURITY_H_
#define DP_PROTO_SECURITY_H_

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/flags.h"

namespace dp {

// The security flags (environment DP_TLS_CERT, ... as for every flag).
struct SecurityFlags {
  std::string tls_cert;         // PEM certificate chain of this process
  std::string tls_key;          // PEM private key of tls_cert
  std::string tls_ca;           // PEM CA bundle that verifies the peer
  std::string auth_token_file;  // file holding the shared token
  std::string tls_server_name;  // dp-worker: name to verify instead of --ps's
};

enum class Side { kServer, kClient };
// Registers --tls_cert, --tls_key, --tls_ca, --auth_token_file and, for
// clients, --tls_server_name, writing into *values.
void AddSecurityFlags(Flags* flags, SecurityFlags* values, Side side);

// dp-ps: --tls_cert + --tls_key turn on TLS; --tls_ca on top requires every
// client to present a certificate that this CA signed (mTLS).
struct ServerSecurity {
  std::shared_ptr<grpc::ServerCredentials> credentials;  // never null
  bool tls = false;
  bool mutual_tls = false;
  std::string auth_token;  // empty: calls need no token
  // "mTLS (client certificates verified against ca.pem) + token", for logs.
  std::string Describe() const;
};
absl::StatusOr<ServerSecurity> LoadServerSecurity(const SecurityFlags& flags);

// dp-worker: TLS when --tls_ca or --tls_cert is given. The server is
// verified against --tls_ca (the system's roots when it is empty); the client
// presents --tls_cert + --tls_key when they are given.
struct ClientSecurity {
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // never null
  bool tls = false;
  std::string server_name;  // SSL target name override; empty: from --ps
  std::string auth_token;   // empty: no token sent
  std::string Describe() const;
};
absl::StatusOr<ClientSecurity> LoadClientSecurity(const SecurityFlags& flags);

// Whether `host` (as given to --host) only accepts connections from this
// machine: localhost, 127.0.0.0/8, ::1.
bool IsLoopbackHost(absl::string_view host);
// The warning to print when dp-ps listens on `host` without TLS, or nullopt.
std::optional<std::string> PlaintextWarning(absl::string_view host,
                                            const ServerSecurity& security);

// The metadata key and value prefix of the token: "authorization: Bearer t".
inline constexpr char kAuthMetadataKey[] = "authorization";
inline constexpr char kBearerPrefix[] = "Bearer ";
// Tokens are 16..4096 bytes of printable ASCII without spaces.
inline constexpr size_t kMinTokenBytes = 16;
inline constexpr size_t kMaxTokenBytes = 4096;

// The token in `path`, without trailing whitespace. INVALID_ARGUMENT naming
// the file when it cannot be read or is not a valid token. Logs
// TokenModeWarning's warning, if any.
absl::StatusOr<std::string> ReadAuthToken(const std::string& path);

// The warning for a token file at `path` of permission bits `mode` and group
// `file_group`, read by a process whose effective group is `own_group`, or
// nullopt: any access for others, or read access for a group that is not
// the process's own. A Kubernetes Secret mounted with an fsGroup is 0440 at
// least, its group the pod's fsGroup, which the manifests make the
// container's group: that is no warning.
std::optional<std::string> TokenModeWarning(const std::string& path,
                                            unsigned mode, unsigned file_group,
                                            unsigned own_group);

// Equal contents, in time that depends only on the length of `expected`.
bool ConstantTimeEquals(absl::string_view given, absl::string_view expected);

// dp-ps's side of the token: every call must carry exactly one
// "authorization: Bearer <token>" entry with the right token.
class TokenChecker {
 public:
  // An empty token admits every call.
  explicit TokenChecker(const std::string& token);
  // OK, or UNAUTHENTICATED saying whether the token was missing or wrong
  // (never what it should have been).
  absl::Status Check(
      const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const;

 private:
  std::string expected_;  // "Bearer <token>", empty when off
};

// Adds the token to a client call (nothing when `token` is empty).
void AttachToken(const std::string& token, grpc::ClientContext* context);

}  // namespace dp

#endif  // DP_PROTO_SECURITY_H_
