// grpc.health.v1 Check and Watch for tests.
#include "tests/health_client.h"

#include <algorithm>

#include "absl/time/clock.h"
#include "proto/grpc_status.h"

namespace dp {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

absl::StatusOr<HealthStatus> CheckHealth(const std::string& address,
                                         const std::string& service) {
  auto stub = Health::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  HealthCheckRequest request;
  request.set_service(service);
  HealthCheckResponse response;
  absl::Status s = FromGrpcStatus(stub->Check(&context, request, &response));
  if (!s.ok()) return s;
  return response.status();
}

HealthWatcher::HealthWatcher(const std::string& address,
                             const std::string& service)
    : stub_(Health::NewStub(
          grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))) {
  // Wait for the server to come up rather than failing at once.
  context_.set_wait_for_ready(true);
  HealthCheckRequest request;
  request.set_service(service);
  reader_ = std::thread([this, request] {
    auto stream = stub_->Watch(&context_, request);
    HealthCheckResponse response;
    while (stream->Read(&response)) {
      absl::MutexLock lock(&mu_);
      statuses_.push_back(response.status());
    }
    (void)stream->Finish();
    absl::MutexLock lock(&mu_);
    ended_ = true;
  });
}

HealthWatcher::~HealthWatcher() {
  context_.TryCancel();
  reader_.join();
}

bool HealthWatcher::WaitFor(HealthStatus status, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto seen = [this, status]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return ended_ || std::find(statuses_.begin(), statuses_.end(), status) !=
                         statuses_.end();
  };
  mu_.AwaitWithTimeout(absl::Condition(&seen), timeout);
  return std::find(statuses_.begin(), statuses_.end(), status) !=
         statuses_.end();
}

bool HealthWatcher::WaitForEnd(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&ended_), timeout);
}

std::vector<HealthStatus> HealthWatcher::statuses() const {
  absl::MutexLock lock(&mu_);
  return statuses_;
}

}  // namespace dp
