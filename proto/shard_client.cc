// GetStatus of another shard, as plain types.
#include "proto/shard_client.h"

#include <utility>

#include "absl/time/clock.h"
#include "proto/dp.grpc.pb.h"
#include "proto/grpc_server.h"
#include "proto/grpc_status.h"
#include "proto/security.h"
#include "proto/wire.h"

namespace dp {

struct ShardClient::Stub {
  std::unique_ptr<dp::v1::ParameterServer::Stub> stub;
};

ShardClient::ShardClient(const std::string& address, int64_t num_params,
                         std::shared_ptr<grpc::ChannelCredentials> credentials,
                         const std::string& server_name, std::string auth_token)
    : auth_token_(std::move(auth_token)),
      num_params_(num_params),
      stub_(std::make_unique<Stub>(Stub{dp::v1::ParameterServer::NewStub(
          ClientChannel(address, MessageBytesFor(num_params),
                        std::move(credentials), server_name))})) {}

ShardClient::~ShardClient() = default;

namespace {

absl::Status GetStatus(dp::v1::ParameterServer::Stub& stub,
                       const std::string& auth_token,
                       const dp::v1::GetStatusRequest& request,
                       dp::v1::GetStatusResponse* response) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  AttachToken(auth_token, &ctx);
  return FromGrpcStatus(stub.GetStatus(&ctx, request, response));
}

}  // namespace

absl::StatusOr<ShardClient::Report> ShardClient::Status(bool with_params) {
  dp::v1::GetStatusRequest request;
  request.set_with_params(with_params);
  dp::v1::GetStatusResponse response;
  if (absl::Status s = GetStatus(*stub_->stub, auth_token_, request, &response);
      !s.ok()) {
    return s;
  }
  Report report;
  report.shard = FromProto(response.shard(), response.step(), num_params_);
  report.params = std::move(*response.mutable_params());
  return report;
}

absl::Status ShardClient::Release(int64_t step) {
  dp::v1::GetStatusRequest request;
  request.set_collected(step);
  dp::v1::GetStatusResponse response;
  return GetStatus(*stub_->stub, auth_token_, request, &response);
}

}  // namespace dp
