// Collecting the final weights from every shard.
#include "server/shard_gather.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/security.h"
#include "proto/dp.grpc.pb.h"

namespace dp {

absl::StatusOr<std::vector<float>> GatherShards(const GatherOptions& options,
                                                const ModelLayout& layout,
                                                int count, int64_t step,
                                                int own_index,
                                                const std::vector<float>& own) {
  const std::vector<ParamRange> ranges = ShardRanges(layout, count);
  std::vector<float> params(layout.num_params());
  std::vector<bool> have(count, false);
  if (own.size() != static_cast<size_t>(ranges[own_index].length)) {
    return absl::InternalError("this shard's weights do not fit its range");
  }
  std::copy(own.begin(), own.end(), params.begin() + ranges[own_index].offset);
  have[own_index] = true;
  grpc::ChannelArguments args =
      ClientChannelArguments(MessageBytesFor(layout.num_params()));
  if (!options.server_name.empty()) {
    args.SetSslTargetNameOverride(options.server_name);
  }
  std::vector<std::unique_ptr<dp::v1::ParameterServer::Stub>> stubs;
  for (const std::string& address : options.addresses) {
    stubs.push_back(dp::v1::ParameterServer::NewStub(grpc::CreateCustomChannel(
        address,
        options.credentials ? options.credentials
                            : grpc::InsecureChannelCredentials(),
        args)));
  }
  const absl::Time start = absl::Now();
  // When each address last answered (start: not yet).
  std::vector<absl::Time> answered(stubs.size(), start);
  absl::Time logged = start;
  auto call = [&](size_t a, dp::v1::GetStatusRequest request,
                  dp::v1::GetStatusResponse* response) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    AttachToken(options.auth_token, &ctx);
    return FromGrpcStatus(stubs[a]->GetStatus(&ctx, request, response));
  };
  // Which shard each address turned out to be (-1: not known yet).
  std::vector<int> shard_of(stubs.size(), -1);
  std::vector<std::string> waiting;
  for (;;) {
    waiting.clear();
    for (size_t a = 0; a < stubs.size(); ++a) {
      if (shard_of[a] >= 0 && have[shard_of[a]]) continue;
      dp::v1::GetStatusRequest request;
      request.set_with_params(true);
      dp::v1::GetStatusResponse response;
      const absl::Status s = call(a, request, &response);
      if (s.ok()) answered[a] = absl::Now();
      if (!s.ok()) {
        waiting.push_back(
            absl::StrFormat("%s (%s)", options.addresses[a], s.message()));
        continue;
      }
      const dp::v1::ShardInfo& info = response.shard();
      const int k = info.index();
      if (info.count() != count || k < 0 || k >= count ||
          info.offset() != ranges[k].offset ||
          info.length() != ranges[k].length) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "%s is shard %d of %d [%d, +%d); this job has %d shards",
            options.addresses[a], k, info.count(), info.offset(), info.length(),
            count));
      }
      shard_of[a] = k;
      if (have[k]) continue;  // this shard, or one already collected
      if (response.step() != step) {
        waiting.push_back(absl::StrFormat("%s (shard %d at step %d)",
                                          options.addresses[a], k,
                                          response.step()));
        continue;
      }
      if (response.params().size() != ranges[k].length * sizeof(float)) {
        return absl::DataLossError(absl::StrFormat(
            "%s sent %d bytes of weights for %d values", options.addresses[a],
            response.params().size(), ranges[k].length));
      }
      std::memcpy(params.data() + ranges[k].offset, response.params().data(),
                  response.params().size());
      have[k] = true;
    }
    std::vector<int> missing;
    for (int k = 0; k < count; ++k) {
      if (!have[k]) missing.push_back(k);
    }
    if (missing.empty()) break;
    const absl::Time now = absl::Now();
    for (size_t a = 0; a < stubs.size(); ++a) {
      const bool lacking = shard_of[a] < 0 || !have[shard_of[a]];
      if (lacking && now - answered[a] > options.timeout) {
        return absl::DeadlineExceededError(absl::StrFormat(
            "the weights of step %d are missing shard(s) %s; %s has not "
            "answered for %s; not ready: %s",
            step, absl::StrJoin(missing, ","), options.addresses[a],
            absl::FormatDuration(options.timeout),
            absl::StrJoin(waiting, "; ")));
      }
    }
    if (options.keep_going && !options.keep_going()) {
      return absl::CancelledError(absl::StrFormat(
          "the collection of the weights of step %d stopped", step));
    }
    if (now - logged >= options.timeout) {
      Log("collecting the weights of step %d for %.0f s; waiting for %s", step,
          absl::ToDoubleSeconds(now - start), absl::StrJoin(waiting, "; "));
      logged = now;
    }
    absl::SleepFor(absl::Milliseconds(100));  // a shard still catching up
  }
  // Now the other shards may go. Best effort: one that does not hear it
  // exits after its --final_eval_timeout_s.
  for (size_t a = 0; a < stubs.size(); ++a) {
    if (shard_of[a] < 0 || shard_of[a] == own_index) continue;
    dp::v1::GetStatusRequest request;
    request.set_collected(step);
    dp::v1::GetStatusResponse response;
    (void)call(a, request, &response);
  }
  return params;
}

}  // namespace dp
