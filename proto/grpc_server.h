// Starting a gRPC server the same way in dp-ps, dp-worker and tests: explicit
// message-size, stream and keepalive limits, no SO_REUSEPORT (so a busy port
// is an error instead of two servers silently sharing it), the port actually
// bound, the standard health service (grpc.health.v1) and server reflection.
// Clients take their channel arguments from here too, so the two sides agree.
#ifndef DP_PROTO_GRPC_SERVER_H_
#define DP_PROTO_GRPC_SERVER_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/server_interceptor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dp {

// Keepalive, the same numbers for both sides. A client pings a connection
// that has been silent for client_time_ms (a barrier wait can be silent for
// long); the server accepts pings as often as min_recv_ping_interval_ms.
// That interval must not exceed the client's, or the server counts the
// client's pings as abuse and closes the connection (GOAWAY
// "too_many_pings"). The server pings its clients too, so that a dead
// client's waiting calls are cancelled.
struct KeepaliveOptions {
  int client_time_ms = 20'000;
  int server_time_ms = 60'000;
  int timeout_ms = 10'000;
  int min_recv_ping_interval_ms = 10'000;
};

struct GrpcServerOptions {
  std::string address = "0.0.0.0:0";  // host:port; port 0 picks a free one
  int max_message_bytes = 4 << 20;
  std::shared_ptr<grpc::ServerCredentials> credentials;  // default insecure
  // Initial readiness (see SetReady).
  bool ready = true;
  KeepaliveOptions keepalive;
  // Per connection: a worker needs two (a call and a status query).
  int max_concurrent_streams = 16;
  // A connection that has not finished its (TLS) handshake by then is
  // closed, so idle half-open connections cannot pile up.
  int handshake_timeout_ms = 10'000;
  // Request headers, the token included.
  int max_metadata_bytes = 16 << 10;
  // Interceptors of every call, made afresh for each server (a test acts
  // between two calls of a worker with one). Unset: none.
  using Interceptors = std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>;
  std::function<Interceptors()> interceptors;
};

// The grpc.health.v1 contract that the Kubernetes probes rely on:
// - "" (the whole server) is readiness: SERVING while the process does its
//   work (dp-ps: accepts steps; dp-worker: has joined the job), NOT_SERVING
//   while starting or draining.
// - kLivenessService is SERVING from start until the server shuts down.
inline constexpr char kLivenessService[] = "liveness";

// gRPC tears its threads down when its last user goes (grpc_shutdown), and
// joins them. A TCP write that found the socket buffer full leaves a backup
// poller on gRPC's executor waiting in epoll for up to 10 s, so a process
// whose connections had filled a slow link (a dp-ps shard whose link is
// shaped, say) took up to 10 s to exit after its work was done. dp-ps and
// dp-worker call this once at start: one reference held for the life of the
// process, so that no grpc_shutdown waits; the threads end with the process.
// It starts gRPC's threads, so it must come after a signal mask is set.
// OpenSSL is kept to the end as well (no clean-up at exit), since those
// threads may be in a TLS handshake when the process exits.
void KeepGrpcForTheProcess();

struct RunningServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

// UNAVAILABLE naming the address when it cannot be bound (busy port, bad
// address, credentials gRPC refuses). Raises the process's soft open-file
// limit to the hard one first (see grpc_server.cc).
absl::StatusOr<RunningServer> StartGrpcServer(
    const GrpcServerOptions& options,
    const std::vector<grpc::Service*>& services);

// Sets readiness: the service "" and each of `services` (e.g.
// "dp.v1.ParameterServer") to SERVING or NOT_SERVING. Liveness is unchanged.
void SetReady(grpc::Server* server, bool ready,
              const std::vector<std::string>& services = {});

// Channel arguments matching the server's limits and keepalive.
grpc::ChannelArguments ClientChannelArguments(
    int max_message_bytes, const KeepaliveOptions& keepalive = {});

// A channel to `address` with those arguments: the one way dp-worker and
// dp-ps's shard 0 call dp-ps. Null credentials: plaintext; `server_name`,
// when set, is the name the server's certificate must carry instead of the
// address's host.
std::shared_ptr<grpc::Channel> ClientChannel(
    const std::string& address, int max_message_bytes,
    const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    const std::string& server_name);

// Bytes needed for a message carrying n float32 values, plus framing slack.
int MessageBytesFor(int64_t num_floats);

}  // namespace dp

#endif  // DP_PROTO_GRPC_SERVER_H_
