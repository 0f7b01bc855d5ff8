// A plaintext gRPC server with only grpc.health.v1 (and reflection): the
// port the kubelet's gRPC probes use, which speak neither TLS nor client
// certificates. dp-ps runs it beside its main port (--health_port), a
// dp-worker as its only server. It reveals whether the process is serving,
// nothing else, and takes no token.
#ifndef DP_PROTO_HEALTH_SERVER_H_
#define DP_PROTO_HEALTH_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dp {

class HealthServer {
 public:
  // Starts on host:port (0 picks a free port), NOT_SERVING until
  // SetReady(true); liveness ("liveness") is SERVING from the start.
  // UNAVAILABLE naming the address when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<HealthServer>> Start(
      const std::string& host, int port);
  // Shutdown(1 s) unless it was shut down already.
  ~HealthServer();

  int port() const { return port_; }
  // Readiness of "" and of `services`, as proto/grpc_server.h's SetReady.
  // Safe during and after Shutdown (it then changes nothing).
  void SetReady(bool ready, const std::vector<std::string>& services = {});
  // Stops serving; open Watch streams are cancelled after `grace` (a plain
  // grpc::Server would wait for them forever).
  void Shutdown(absl::Duration grace);

 private:
  HealthServer(std::unique_ptr<grpc::Server> server, int port)
      : server_(std::move(server)), port_(port) {}
  std::unique_ptr<grpc::Server> server_;
  int port_;
};

}  // namespace dp

#endif  // DP_PROTO_HEALTH_SERVER_H_
