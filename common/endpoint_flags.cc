// The metrics and health endpoint flags of both programs.
#include "common/endpoint_flags.h"

#include "common/metrics.h"

namespace dp {

void AddEndpointFlags(Flags* flags, EndpointFlags* f, const char* health_help) {
  flags->AddInt("health_port", &f->health_port, health_help).InRange(-1, 65535);
  flags
      ->AddInt("metrics_port", &f->metrics_port,
               "Prometheus metrics port (0 = off, -1 = any free port)")
      .Satisfies([f] { return ValidateMetricsPort(f->metrics_port); });
  flags->AddString("metrics_host", &f->metrics_host,
                   "address the metrics endpoint listens on (0.0.0.0 or ::: "
                   "every IPv4 and IPv6 address; an IPv6 address with or "
                   "without brackets)");
}

}  // namespace dp
