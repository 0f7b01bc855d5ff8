// The worker's view of dp-ps: one method per RPC, every call with a deadline,
// UNAVAILABLE retried with exponential backoff and jitter (dp-ps starting or
// restarting), errors as absl::Status with the server's message.
#ifndef DP_WORKER_PS_CLIENT_H_
#define DP_WORKER_PS_CLIENT_H_

#include <memory>
#include <string>
#include <vector>

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
  // What Pull and PushPull receive.
  struct Weights {
    dp::v1::PullResponse header;  // step, offset, done; params left empty
    std::vector<float> params;    // keeps its capacity from call to call
    int64_t wire_bytes = 0;       // size of the message
  };
  absl::Status Pull(int rank, Weights* weights);
  // `request` is a PushRequest built with SerializeWithTensor
  // so that the gradient is sent from the caller's buffer.
  absl::StatusOr<dp::v1::PushResponse> Push(const grpc::ByteBuffer& request);
  absl::StatusOr<dp::v1::BarrierResponse> Barrier(int rank, int64_t step);
  // The fused call: push, wait at the barrier, receive the new weights.
  absl::Status PushPull(const grpc::ByteBuffer& request, Weights* weights);
  absl::Status ReportEval(const dp::v1::ReportEvalRequest& request);

  const std::string& address() const { return options_.address; }

 private:
  // Runs `call(context)` with a fresh context and deadline until it returns
  // anything but UNAVAILABLE or retry_for has passed.
  template <typename Call>
  absl::Status WithRetry(const char* what, absl::Duration timeout, Call call);

  // A call whose messages are raw bytes, so that tensors skip protobuf's
  // copies. It is the blocking call generated stubs make, with the
  // ByteBuffer codec instead of the protobuf one.
  grpc::Status RawCall(const grpc::internal::RpcMethod& method,
                       grpc::ClientContext* context,
                       const grpc::ByteBuffer& request,
                       grpc::ByteBuffer* response);
  // Parses a PullResponse into *weights.
  absl::Status ReadWeights(const grpc::ByteBuffer& response, Weights* weights);

  PsClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<dp::v1::ParameterServer::Stub> stub_;
  const grpc::internal::RpcMethod pull_method_;
  const grpc::internal::RpcMethod push_method_;
  const grpc::internal::RpcMethod push_pull_method_;
  std::string scratch_;  // received weights that need decoding
};

}  // namespace dp

#endif  // DP_WORKER_PS_CLIENT_H_
