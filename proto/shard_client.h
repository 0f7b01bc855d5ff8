// One dp-ps asking another, a shard of its job, what it is and holds:
// shard 0's side of the collection of the final weights, and of letting the
// other shards go. Plain types in and out; the messages stay here.
#ifndef DP_PROTO_SHARD_CLIENT_H_
#define DP_PROTO_SHARD_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/shard_plan.h"

namespace grpc {
class ChannelCredentials;
}  // namespace grpc

namespace dp {

class ShardClient {
 public:
  // A shard at `address` of a model of `num_params` values; credentials
  // null: plaintext; server_name: the TLS name to verify instead of the
  // address's.
  ShardClient(const std::string& address, int64_t num_params,
              std::shared_ptr<grpc::ChannelCredentials> credentials,
              const std::string& server_name, std::string auth_token);
  ~ShardClient();

  struct Report {
    ShardState shard;    // what it is, at its step
    std::string params;  // its range of the weights (float32), if asked
  };
  // Its status, and with `with_params` its weights; the call's error if it
  // did not answer within 10 s.
  absl::StatusOr<Report> Status(bool with_params);
  // Tells it the job is over at `step` (GetStatus collected): it may exit.
  absl::Status Release(int64_t step);

 private:
  struct Stub;
  const std::string auth_token_;
  const int64_t num_params_;
  std::unique_ptr<Stub> stub_;
};

}  // namespace dp

#endif  // DP_PROTO_SHARD_CLIENT_H_
