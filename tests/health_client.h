// A grpc.health.v1 client for tests: one Check, or a Watch stream that
// records every status it receives.
#ifndef DP_TESTS_HEALTH_CLIENT_H_
#define DP_TESTS_HEALTH_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/health.grpc.pb.h"

namespace dp {

using HealthStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;
inline constexpr HealthStatus kServing =
    grpc::health::v1::HealthCheckResponse::SERVING;
inline constexpr HealthStatus kNotServing =
    grpc::health::v1::HealthCheckResponse::NOT_SERVING;

// Health/Check of `service` at `address` (host:port), with a deadline.
// NOT_FOUND for a service the server does not know.
absl::StatusOr<HealthStatus> CheckHealth(const std::string& address,
                                         const std::string& service);

// Health/Watch of one service, read on its own thread until the stream ends
// or the watcher is destroyed.
class HealthWatcher {
 public:
  HealthWatcher(const std::string& address, const std::string& service);
  ~HealthWatcher();

  // True once `status` has been received (now or within `timeout`).
  bool WaitFor(HealthStatus status, absl::Duration timeout);
  // True once the stream has ended (the server went away).
  bool WaitForEnd(absl::Duration timeout);
  std::vector<HealthStatus> statuses() const;

 private:
  std::unique_ptr<grpc::health::v1::Health::Stub> stub_;
  grpc::ClientContext context_;
  std::thread reader_;
  mutable absl::Mutex mu_;
  std::vector<HealthStatus> statuses_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace dp

#endif  // DP_TESTS_HEALTH_CLIENT_H_
