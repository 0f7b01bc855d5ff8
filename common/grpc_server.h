// Starting a gRPC server the same way in dp-ps, dp-worker and tests: explicit
// message-size limits, no SO_REUSEPORT (so a busy port is an error instead of
// two servers silently sharing it), the port actually bound, the standard
// health service (grpc.health.v1) and server reflection.
#ifndef DP_COMMON_GRPC_SERVER_H_
#define DP_COMMON_GRPC_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"

namespace dp {

struct GrpcServerOptions {
  std::string address = "0.0.0.0:0";   // host:port; port 0 picks a free one
  int max_message_bytes = 4 << 20;
  std::shared_ptr<grpc::ServerCredentials> credentials;  // default insecure
  // Initial readiness (see SetReady).
  bool ready = true;
};

// The grpc.health.v1 contract that the Kubernetes probes rely on:
// - "" (the whole server) is readiness: SERVING while the process does its
//   work (dp-ps: accepts steps; dp-worker: has joined the job), NOT_SERVING
//   while starting or draining.
// - kLivenessService is SERVING from start until the server shuts down.
inline constexpr char kLivenessService[] = "liveness";

struct RunningServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

// UNAVAILABLE naming the address when it cannot be bound (busy port, bad
// address).
absl::StatusOr<RunningServer> StartGrpcServer(
    const GrpcServerOptions& options, const std::vector<grpc::Service*>& services);

// Sets readiness: the service "" and each of `services` (e.g.
// "dp.v1.ParameterServer") to SERVING or NOT_SERVING. Liveness is unchanged.
void SetReady(grpc::Server* server, bool ready,
              const std::vector<std::string>& services = {});

// Channel arguments matching the server's limits.
grpc::ChannelArguments ClientChannelArguments(int max_message_bytes);

// Bytes needed for a message carrying n float32 values, plus framing slack.
int MessageBytesFor(int64_t num_floats);

}  // namespace dp

#endif  // DP_COMMON_GRPC_SERVER_H_
