// health_probe: one grpc.health.v1 Check, as the kubelet's gRPC probe makes
// it, for scripts (scripts/container-check.sh probes the containers from the
// host). Prints the status and exits 0 only when it is SERVING.
//   health_probe HOST:PORT [SERVICE]
#include <cstdio>
#include <string>

#include "tests/health_client.h"

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: %s HOST:PORT [SERVICE]\n", argv[0]);
    return 2;
  }
  const std::string address = argv[1];
  const std::string service = argc == 3 ? argv[2] : "";
  absl::StatusOr<dp::HealthStatus> status = dp::CheckHealth(address, service);
  if (!status.ok()) {
    std::printf("%s service \"%s\": %s\n", address.c_str(), service.c_str(),
                status.status().ToString().c_str());
    return 1;
  }
  std::printf("%s service \"%s\": %s\n", address.c_str(), service.c_str(),
              grpc::health::v1::HealthCheckResponse::ServingStatus_Name(*status)
                  .c_str());
  return *status == dp::kServing ? 0 : 1;
}
