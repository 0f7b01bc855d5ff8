// gRPC client of dp-ps with deadlines and backoff.
#include "worker/ps_client.h"

#include <algorithm>
#include <random>

#include <grpcpp/impl/client_unary_call.h>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/security.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "common/tensor_message.h"

namespace dp {

namespace {

std::shared_ptr<grpc::Channel> MakeChannel(const PsClientOptions& options) {
  grpc::ChannelArguments args =
      ClientChannelArguments(options.max_message_bytes);
  if (!options.tls_server_name.empty()) {
    args.SetSslTargetNameOverride(options.tls_server_name);
  }
  return grpc::CreateCustomChannel(
      options.address,
      options.credentials ? options.credentials
                          : grpc::InsecureChannelCredentials(),
      args);
}

// The full names of the raw calls, as the generated stub spells them (a
// typo shows as UNIMPLEMENTED in every job test).
constexpr char kPullMethod[] = "/dp.v1.ParameterServer/Pull";
constexpr char kPushMethod[] = "/dp.v1.ParameterServer/Push";
constexpr char kPushPullMethod[] = "/dp.v1.ParameterServer/PushPull";

}  // namespace

PsClient::PsClient(const PsClientOptions& options)
    : options_(options),
      channel_(MakeChannel(options_)),
      stub_(dp::v1::ParameterServer::NewStub(channel_)),
      pull_method_(kPullMethod, grpc::internal::RpcMethod::NORMAL_RPC,
                   channel_),
      push_method_(kPushMethod, grpc::internal::RpcMethod::NORMAL_RPC,
                   channel_),
      push_pull_method_(kPushPullMethod,
                        grpc::internal::RpcMethod::NORMAL_RPC, channel_) {}

grpc::Status PsClient::RawCall(const grpc::internal::RpcMethod& method,
                               grpc::ClientContext* context,
                               const grpc::ByteBuffer& request,
                               grpc::ByteBuffer* response) {
  return grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      channel_.get(), method, context, request, response);
}

absl::Status PsClient::ReadWeights(const grpc::ByteBuffer& response,
                                   Weights* weights) {
  ReceivedTensor params;
  RETURN_IF_ERROR(ParseWithTensor(response,
                                  dp::v1::PullResponse::kParamsFieldNumber,
                                  &weights->header, &params));
  const dp::v1::Encoding e = weights->header.encoding();
  if (e != dp::v1::ENCODING_F32 && e != dp::v1::ENCODING_BF16) {
    return absl::DataLossError(
        absl::StrFormat("dp-ps at %s sent weights in an unknown encoding %d",
                        options_.address, static_cast<int>(e)));
  }
  const Encoding encoding = static_cast<Encoding>(e);
  const size_t width = BytesPerValue(encoding);
  if (params.size() % width != 0) {
    return absl::DataLossError(absl::StrFormat(
        "dp-ps at %s sent %d bytes of weights, not a whole number of %s "
        "values",
        options_.address, params.size(), EncodingName(encoding)));
  }
  weights->params.resize(params.size() / width);
  if (encoding == Encoding::kF32) {
    params.CopyTo(reinterpret_cast<char*>(weights->params.data()));
  } else {
    // A value may straddle two received slices: decode from one piece.
    Decode(encoding, params.Contiguous(&scratch_).data(),
           weights->params.size(), weights->params.data());
  }
  weights->wire_bytes = static_cast<int64_t>(response.Length());
  return absl::OkStatus();
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

absl::Status PsClient::Pull(int rank, Weights* weights) {
  dp::v1::PullRequest request;
  request.set_rank(rank);
  const grpc::ByteBuffer bytes = SerializeMessage(request);
  grpc::ByteBuffer response;
  RETURN_IF_ERROR(
      WithRetry("Pull", options_.call_timeout, [&](grpc::ClientContext* c) {
        return RawCall(pull_method_, c, bytes, &response);
      }));
  return ReadWeights(response, weights);
}

absl::StatusOr<dp::v1::PushResponse> PsClient::Push(
    const grpc::ByteBuffer& request) {
  grpc::ByteBuffer bytes;
  RETURN_IF_ERROR(
      WithRetry("Push", options_.call_timeout, [&](grpc::ClientContext* c) {
        return RawCall(push_method_, c, request, &bytes);
      }));
  dp::v1::PushResponse response;
  RETURN_IF_ERROR(ParseMessage(bytes, &response));
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

absl::Status PsClient::PushPull(const grpc::ByteBuffer& request,
                                Weights* weights) {
  grpc::ByteBuffer response;
  RETURN_IF_ERROR(WithRetry("PushPull", options_.wait_timeout,
                            [&](grpc::ClientContext* c) {
                              return RawCall(push_pull_method_, c, request,
                                             &response);
                            }));
  return ReadWeights(response, weights);
}

absl::Status PsClient::ReportEval(const dp::v1::ReportEvalRequest& request) {
  dp::v1::ReportEvalResponse response;
  return WithRetry("ReportEval", options_.call_timeout,
                   [&](grpc::ClientContext* c) {
                     return stub_->ReportEval(c, request, &response);
                   });
}

}  // namespace dp
