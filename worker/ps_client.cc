// gRPC client of dp-ps with deadlines and backoff.
#include "worker/ps_client.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/security.h"

namespace dp {

PsClient::PsClient(const PsClientOptions& options) : options_(options) {
  grpc::ChannelArguments args =
      ClientChannelArguments(options_.max_message_bytes);
  if (!options_.tls_server_name.empty()) {
    args.SetSslTargetNameOverride(options_.tls_server_name);
  }
  auto channel = grpc::CreateCustomChannel(
      options_.address,
      options_.credentials ? options_.credentials
                           : grpc::InsecureChannelCredentials(),
      args);
  stub_ = dp::v1::ParameterServer::NewStub(channel);
}

template <typename Call>
absl::Status PsClient::WithRetry(const char* what, absl::Duration timeout,
                                 Call call) {
  const absl::Time give_up = absl::Now() + options_.retry_for;
  absl::Duration backoff = absl::Milliseconds(50);
  std::minstd_rand jitter(std::random_device{}());
  for (int attempt = 1;; ++attempt) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    AttachToken(options_.auth_token, &context);
    absl::Status s = FromGrpcStatus(call(&context));
    if (s.code() != absl::StatusCode::kUnavailable) return s;
    if (absl::Now() + backoff > give_up) {
      return absl::UnavailableError(absl::StrFormat(
          "dp-ps at %s is unavailable for %s after %d attempts over %s: %s "
          "(when dp-ps is up, this is also how a TLS mismatch shows: "
          "plaintext against TLS, or a certificate the other side refuses; "
          "compare --tls_ca, --tls_cert and --tls_key of both)",
          options_.address, what, attempt,
          absl::FormatDuration(options_.retry_for), s.message()));
    }
    if (attempt == 1 || attempt % 10 == 0) {
      Log("dp-ps at %s unavailable (%s), retrying %s", options_.address,
          s.message(), what);
    }
    // Full jitter keeps restarted workers from reconnecting in lockstep.
    const double factor = std::uniform_real_distribution<double>(0.5, 1.0)(jitter);
    absl::SleepFor(backoff * factor);
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
}

absl::StatusOr<dp::v1::GetStatusResponse> PsClient::GetStatus() {
  dp::v1::GetStatusResponse response;
  dp::v1::GetStatusRequest request;
  absl::Status s = WithRetry("GetStatus", options_.call_timeout,
                             [&](grpc::ClientContext* c) {
                               return stub_->GetStatus(c, request, &response);
                             });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<dp::v1::RegisterResponse> PsClient::Register(
    const dp::v1::RegisterRequest& request) {
  dp::v1::RegisterResponse response;
  absl::Status s = WithRetry("Register", options_.call_timeout,
                             [&](grpc::ClientContext* c) {
                               return stub_->Register(c, request, &response);
                             });
  if (!s.ok()) return s;
  return response;
}

absl::Status PsClient::Pull(int rank, dp::v1::PullResponse* response) {
  dp::v1::PullRequest request;
  request.set_rank(rank);
  return WithRetry("Pull", options_.call_timeout, [&](grpc::ClientContext* c) {
    return stub_->Pull(c, request, response);
  });
}

absl::StatusOr<dp::v1::PushResponse> PsClient::Push(
    const dp::v1::PushRequest& request) {
  dp::v1::PushResponse response;
  absl::Status s = WithRetry("Push", options_.call_timeout,
                             [&](grpc::ClientContext* c) {
                               return stub_->Push(c, request, &response);
                             });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<dp::v1::BarrierResponse> PsClient::Barrier(int rank,
                                                          int64_t step) {
  dp::v1::BarrierRequest request;
  request.set_rank(rank);
  request.set_step(step);
  dp::v1::BarrierResponse response;
  absl::Status s = WithRetry("Barrier", options_.wait_timeout,
                             [&](grpc::ClientContext* c) {
                               return stub_->Barrier(c, request, &response);
                             });
  if (!s.ok()) return s;
  return response;
}

absl::Status PsClient::PushPull(const dp::v1::PushRequest& request,
                                dp::v1::PullResponse* response) {
  return WithRetry("PushPull", options_.wait_timeout,
                   [&](grpc::ClientContext* c) {
                     return stub_->PushPull(c, request, response);
                   });
}

absl::Status PsClient::ReportEval(const dp::v1::ReportEvalRequest& request) {
  dp::v1::ReportEvalResponse response;
  return WithRetry("ReportEval", options_.call_timeout,
                   [&](grpc::ClientContext* c) {
                     return stub_->ReportEval(c, request, &response);
                   });
}

}  // namespace dp
