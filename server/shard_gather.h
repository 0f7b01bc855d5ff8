// Shard 0 of a sharded job speaks for the job: at the end it collects every
// shard's range of the final weights (GetStatus with_params) into the whole
// vector, which it saves as the model, and once the workers are gone it
// lets the other shards go.
#ifndef DP_SERVER_SHARD_GATHER_H_
#define DP_SERVER_SHARD_GATHER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/model_layout.h"
#include "common/shard_plan.h"

namespace grpc {
class ChannelCredentials;
}  // namespace grpc

namespace dp {

struct GatherOptions {
  // The other shards' addresses; this shard's own may be among them (it is
  // not asked: its range comes from `own`).
  std::vector<std::string> addresses;
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // null: plaintext
  std::string server_name;  // TLS name to verify instead of the address's
  std::string auth_token;
  // How long a shard may go without answering. A shard that answers at an
  // earlier step is alive and waits for a worker (a half-applied last
  // step): it is waited for as long as it takes, and named in the log.
  absl::Duration timeout = absl::Seconds(120);
  // Asked between rounds; false ends the collection (CANCELLED): this
  // shard was stopped or rolled back.
  std::function<bool()> keep_going;
};

// The whole vector of version `step`: `own` (the range of shard
// `own_index`) and the other `count` - 1 shards' ranges. Shards that are not
// there yet (restarting, or a step behind) are asked again;
// DEADLINE_EXCEEDED naming them once one has not answered for `timeout`.
// A shard of another job shape (count, range) is FAILED_PRECONDITION.
absl::StatusOr<std::vector<float>> GatherShards(const GatherOptions& options,
                                                const ModelLayout& layout,
                                                int count, int64_t step,
                                                int own_index,
                                                const std::vector<float>& own);

// Tells every shard at `options.addresses` that the job is over at `step`
// (GetStatus collected): it may exit. Best effort: one that does not hear
// it exits after its --final_eval_timeout_s. Not before the workers are
// gone: a late one still pushes to and pulls from every shard.
void ReleaseShards(const GatherOptions& options, int num_params, int64_t step);

}  // namespace dp

#endif  // DP_SERVER_SHARD_GATHER_H_
