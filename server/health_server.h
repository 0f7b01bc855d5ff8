// dp-ps's health port: a plaintext gRPC server with only grpc.health.v1
// (and reflection), beside the main port. The kubelet's gRPC probes speak
// neither TLS nor client certificates, so with TLS on the main port they
// need a port of their own. It reveals whether dp-ps is serving, nothing
// else, and takes no token.
#ifndef DP_SERVER_HEALTH_SERVER_H_
#define DP_SERVER_HEALTH_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dp {

class HealthServer {
public:
  // Starts on host:port (0 picks a free port), NOT_SERVING until
  // SetReady(true); liveness ("liveness") is SERVING from the start.
  // UNAVAILABLE naming the address when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<HealthServer>>
  Start(const std::string &host, int port);
  // Shuts down, cancelling open Watch streams after a short deadline (a
  // plain grpc::Server would wait for them forever).
  ~HealthServer();

  int port() const { return port_; }
  // Readiness of "" and of `services`, as common/grpc_server.h's SetReady.
  void SetReady(bool ready, const std::vector<std::string> &services);

private:
  HealthServer(std::unique_ptr<grpc::Server> server, int port)
      : server_(std::move(server)), port_(port) {}
  std::unique_ptr<grpc::Server> server_;
  int port_;
};

} // namespace dp

#endif // DP_SERVER_HEALTH_SERVER_H_
