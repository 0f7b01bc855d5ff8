// The worker's view of dp-ps: one method per RPC, every call with a deadline,
// UNAVAILABLE retried with exponential backoff and jitter (dp-ps starting or
// restarting), errors as absl::Status with the server's message.
#ifndef DP_WORKER_PS_CLIENT_H_
#define DP_WORKER_PS_CLIENT_H_

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/dp.grpc.pb.h"

namespace dp {

struct PsClientOptions {
  std::string address = "localhost:5000";
  absl::Duration call_timeout = absl::Seconds(30);
  // A barrier or fused push-pull waits for the slowest worker; when this
  // passes the trainer reports whom it waits for and waits again.
  absl::Duration wait_timeout = absl::Seconds(30);
  // How long UNAVAILABLE is retried before giving up.
  absl::Duration retry_for = absl::Seconds(120);
  int max_message_bytes = 4 << 20;
  // TLS or plaintext (common/security.h); null means plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  std::string tls_server_name;  // verify this name instead of the host's
  std::string auth_token;       // sent with every call when not empty
};

class PsClient {
 public:
  explicit PsClient(const PsClientOptions& options);

  absl::StatusOr<dp::v1::GetStatusResponse> GetStatus();
  absl::StatusOr<dp::v1::RegisterResponse> Register(
      const dp::v1::RegisterRequest& request);
  absl::Status Pull(int rank, dp::v1::PullResponse* response);
  absl::StatusOr<dp::v1::PushResponse> Push(const dp::v1::PushRequest& request);
  absl::StatusOr<dp::v1::BarrierResponse> Barrier(int rank, int64_t step);
  // The fused call: push, wait at the barrier, receive the new weights.
  absl::Status PushPull(const dp::v1::PushRequest& request,
                        dp::v1::PullResponse* response);
  absl::Status ReportEval(const dp::v1::ReportEvalRequest& request);

  const std::string& address() const { return options_.address; }

 private:
  // Runs `call(context)` with a fresh context and deadline until it returns
  // anything but UNAVAILABLE or retry_for has passed.
  template <typename Call>
  absl::Status WithRetry(const char* what, absl::Duration timeout, Call call);

  PsClientOptions options_;
  std::unique_ptr<dp::v1::ParameterServer::Stub> stub_;
};

}  // namespace dp

#endif  // DP_WORKER_PS_CLIENT_H_
