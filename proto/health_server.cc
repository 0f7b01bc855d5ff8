// The plaintext health port (see health_server.h).
#include "proto/health_server.h"

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "proto/grpc_server.h"

namespace dp {

absl::StatusOr<std::unique_ptr<HealthServer>> HealthServer::Start(
    const std::string& host, int port) {
  GrpcServerOptions options;
  options.address = absl::StrFormat("%s:%d", host, port);
  options.credentials = nullptr;  // plaintext, whatever the main port uses
  options.ready = false;
  absl::StatusOr<RunningServer> running = StartGrpcServer(options, {});
  if (!running.ok()) return running.status();
  return std::unique_ptr<HealthServer>(
      new HealthServer(std::move(running->server), running->port));
}

HealthServer::~HealthServer() { Shutdown(absl::Seconds(1)); }

void HealthServer::SetReady(bool ready,
                            const std::vector<std::string>& services) {
  dp::SetReady(server_.get(), ready, services);
}

void HealthServer::Shutdown(absl::Duration grace) {
  // A second Shutdown returns at once: gRPC makes it idempotent.
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
}

}  // namespace dp
