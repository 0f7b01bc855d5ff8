// The flags of the endpoints both dp-ps and dp-worker serve beside their own
// work: the Prometheus metrics endpoint and the plain grpc.health.v1 port.
#ifndef DP_COMMON_ENDPOINT_FLAGS_H_
#define DP_COMMON_ENDPOINT_FLAGS_H_

#include <string>

#include "common/flags.h"

namespace dp {

struct EndpointFlags {
  int health_port = -1;  // -1: off, 0: any free port
  int metrics_port = 0;  // 0: off, -1: any free port
  std::string metrics_host = "0.0.0.0";
};

// Adds --health_port (described by `health_help`, which differs between the
// programs), --metrics_port and --metrics_host, with their ranges.
void AddEndpointFlags(Flags* flags, EndpointFlags* f, const char* health_help);

}  // namespace dp

#endif  // DP_COMMON_ENDPOINT_FLAGS_H_
