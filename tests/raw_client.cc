// dp.v1 over a raw stub: requests built field by field, calls made once.
#include "tests/raw_client.h"

#include "absl/strings/str_cat.h"

namespace dp {
namespace {

// A context with `call`'s deadline and metadata.
void Prepare(const RawCall& call, grpc::ClientContext* ctx) {
  if (call.timeout != absl::InfiniteDuration()) {
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + call.timeout));
  }
  for (const auto& [key, value] : call.metadata) ctx->AddMetadata(key, value);
}

}  // namespace

std::unique_ptr<RawStub> ConnectRaw(int port) {
  return dp::v1::ParameterServer::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
}

dp::v1::RegisterRequest RawRegisterRequest(int rank, uint64_t model_fingerprint,
                                           const DataFingerprint& data) {
  dp::v1::RegisterRequest request;
  request.set_rank(rank);
  request.set_model_fingerprint(model_fingerprint);
  request.mutable_data()->set_num_samples(data.num_samples);
  request.mutable_data()->set_hash(data.hash);
  return request;
}

dp::v1::PushRequest RawPushRequest(int rank, int64_t step,
                                   absl::Span<const float> gradient,
                                   float loss) {
  dp::v1::PushRequest request;
  request.set_rank(rank);
  request.set_step(step);
  request.set_loss(loss);
  request.set_gradient(
      std::string(reinterpret_cast<const char*>(gradient.data()),
                  gradient.size() * sizeof(float)));
  return request;
}

grpc::Status RawRegister(RawStub& stub, const dp::v1::RegisterRequest& request,
                         dp::v1::RegisterResponse* response,
                         const RawCall& call) {
  grpc::ClientContext ctx;
  Prepare(call, &ctx);
  dp::v1::RegisterResponse unread;
  return stub.Register(&ctx, request, response ? response : &unread);
}

grpc::Status RawPush(RawStub& stub, const dp::v1::PushRequest& request,
                     dp::v1::PushResponse* response, const RawCall& call) {
  grpc::ClientContext ctx;
  Prepare(call, &ctx);
  dp::v1::PushResponse unread;
  return stub.Push(&ctx, request, response ? response : &unread);
}

grpc::Status RawPushPull(RawStub& stub, const dp::v1::PushRequest& request,
                         dp::v1::PullResponse* response, const RawCall& call) {
  grpc::ClientContext ctx;
  Prepare(call, &ctx);
  return stub.PushPull(&ctx, request, response);
}

}  // namespace dp
