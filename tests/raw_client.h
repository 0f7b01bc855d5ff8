// dp.v1 spoken by hand over a raw stub, for tests that build a request field
// by field or send one the worker library never would.
#ifndef DP_TESTS_RAW_CLIENT_H_
#define DP_TESTS_RAW_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/dataset.h"
#include "proto/dp.grpc.pb.h"

namespace dp {

using RawStub = dp::v1::ParameterServer::Stub;

// A stub on 127.0.0.1:port over a plain (insecure) channel.
std::unique_ptr<RawStub> ConnectRaw(int port);

// The registration of `rank` for a model and a data set.
dp::v1::RegisterRequest RawRegisterRequest(int rank, uint64_t model_fingerprint,
                                           const DataFingerprint& data);

// rank's push of the float32 `gradient` for `step`.
dp::v1::PushRequest RawPushRequest(int rank, int64_t step,
                                   absl::Span<const float> gradient,
                                   float loss = 1.0f);

// How one call is made: its deadline (none when infinite) and the metadata
// entries ("key", "value") it carries.
struct RawCall {
  absl::Duration timeout = absl::InfiniteDuration();
  std::vector<std::pair<std::string, std::string>> metadata;
};

// The calls themselves; a null response is one the caller does not read.
grpc::Status RawRegister(RawStub& stub, const dp::v1::RegisterRequest& request,
                         dp::v1::RegisterResponse* response = nullptr,
                         const RawCall& call = {});
grpc::Status RawPush(RawStub& stub, const dp::v1::PushRequest& request,
                     dp::v1::PushResponse* response = nullptr,
                     const RawCall& call = {});
grpc::Status RawPushPull(RawStub& stub, const dp::v1::PushRequest& request,
                         dp::v1::PullResponse* response,
                         const RawCall& call = {});

}  // namespace dp

#endif  // DP_TESTS_RAW_CLIENT_H_
