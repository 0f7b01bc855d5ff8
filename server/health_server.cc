// dp-ps's plaintext health port (see health_server.h).
#include "server/health_server.h"

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/grpc_server.h"

namespace dp {

absl::StatusOr<std::unique_ptr<HealthServer>>
HealthServer::Start(const std::string &host, int port) {
  GrpcServerOptions options;
  options.address = absl::StrFormat("%s:%d", host, port);
  options.credentials = nullptr; // plaintext, whatever the main port uses
  options.ready = false;
  auto running = StartGrpcServer(options, {});
  if (!running.ok())
    return running.status();
  return std::unique_ptr<HealthServer>(
      new HealthServer(std::move(running->server), running->port));
}

HealthServer::~HealthServer() {
  server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
}

void HealthServer::SetReady(bool ready,
                            const std::vector<std::string> &services) {
  dp::SetReady(server_.get(), ready, services);
}

} // namespace dp
