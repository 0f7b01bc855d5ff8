// Collecting the final weights from every shard.
#include "server/shard_gather.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "proto/shard_client.h"

namespace dp {

namespace {

// One collection of the weights of `step`: which address turned out to be
// which shard, which ranges are in, and when each address last answered.
class Collection {
 public:
  Collection(const GatherOptions& options, const ModelLayout& layout, int count,
             int64_t step, int own_index, const std::vector<float>& own)
      : options_(options),
        count_(count),
        step_(step),
        ranges_(ShardRanges(layout, count)),
        params_(layout.num_params()),
        have_(count, false),
        start_(absl::Now()),
        logged_(start_) {
    std::copy(own.begin(), own.end(),
              params_.begin() + ranges_[own_index].offset);
    have_[own_index] = true;
    for (const std::string& address : options.addresses) {
      stubs_.push_back(std::make_unique<ShardClient>(
          address, layout.num_params(), options.credentials,
          options.server_name, options.auth_token));
    }
    answered_.assign(stubs_.size(), start_);
    shard_of_.assign(stubs_.size(), -1);
  }

  // Asks every address whose shard is not in yet. An answer that cannot be
  // this job's (another shape, a wrong size) ends the collection.
  absl::Status AskRound() {
    waiting_.clear();
    for (size_t a = 0; a < stubs_.size(); ++a) {
      if (shard_of_[a] >= 0 && have_[shard_of_[a]]) continue;
      absl::StatusOr<ShardClient::Report> report =
          stubs_[a]->Status(/*with_params=*/true);
      if (!report.ok()) {
        waiting_.push_back(absl::StrFormat("%s (%s)", options_.addresses[a],
                                           report.status().message()));
        continue;
      }
      answered_[a] = absl::Now();
      RETURN_IF_ERROR(Take(a, *report));
    }
    return absl::OkStatus();
  }

  std::vector<int> Missing() const {
    std::vector<int> missing;
    for (int k = 0; k < count_; ++k) {
      if (!have_[k]) missing.push_back(k);
    }
    return missing;
  }

  // DEADLINE_EXCEEDED once an address whose shard is missing has not
  // answered for the timeout, CANCELLED when keep_going says stop; logs
  // whom it waits for once a timeout.
  absl::Status CheckProgress(const std::vector<int>& missing) {
    const absl::Time now = absl::Now();
    for (size_t a = 0; a < stubs_.size(); ++a) {
      const bool lacking = shard_of_[a] < 0 || !have_[shard_of_[a]];
      if (lacking && now - answered_[a] > options_.timeout) {
        return absl::DeadlineExceededError(absl::StrFormat(
            "the weights of step %d are missing shard(s) %s; %s has not "
            "answered for %s; not ready: %s",
            step_, absl::StrJoin(missing, ","), options_.addresses[a],
            absl::FormatDuration(options_.timeout),
            absl::StrJoin(waiting_, "; ")));
      }
    }
    if (options_.keep_going && !options_.keep_going()) {
      return absl::CancelledError(absl::StrFormat(
          "the collection of the weights of step %d stopped", step_));
    }
    if (now - logged_ >= options_.timeout) {
      Log("collecting the weights of step %d for %.0f s; waiting for %s", step_,
          absl::ToDoubleSeconds(now - start_), absl::StrJoin(waiting_, "; "));
      logged_ = now;
    }
    return absl::OkStatus();
  }

  std::vector<float> TakeParams() { return std::move(params_); }

 private:
  // Address a's answer: its shard's range once that is at `step`.
  absl::Status Take(size_t a, const ShardClient::Report& report) {
    const ShardSpec& spec = report.shard.spec;
    const int k = spec.index;
    if (spec.count != count_ || k < 0 || k >= count_ ||
        !(spec.range == ranges_[k])) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s is shard %d of %d [%d, +%d); this job has %d shards",
          options_.addresses[a], k, spec.count, spec.range.offset,
          spec.range.length, count_));
    }
    shard_of_[a] = k;
    if (have_[k]) return absl::OkStatus();  // this shard, or one collected
    if (report.shard.step != step_) {
      waiting_.push_back(absl::StrFormat("%s (shard %d at step %d)",
                                         options_.addresses[a], k,
                                         report.shard.step));
      return absl::OkStatus();
    }
    if (report.params.size() != ranges_[k].length * sizeof(float)) {
      return absl::DataLossError(absl::StrFormat(
          "%s sent %d bytes of weights for %d values", options_.addresses[a],
          report.params.size(), ranges_[k].length));
    }
    std::memcpy(params_.data() + ranges_[k].offset, report.params.data(),
                report.params.size());
    have_[k] = true;
    return absl::OkStatus();
  }

  const GatherOptions& options_;
  const int count_;
  const int64_t step_;
  const std::vector<ParamRange> ranges_;
  std::vector<float> params_;
  std::vector<bool> have_;  // by shard
  std::vector<std::unique_ptr<ShardClient>> stubs_;
  // By address: when it last answered (start: not yet), and which shard it
  // turned out to be (-1: not known yet).
  std::vector<absl::Time> answered_;
  std::vector<int> shard_of_;
  std::vector<std::string> waiting_;  // this round's, for the messages
  const absl::Time start_;
  absl::Time logged_;
};

}  // namespace

absl::StatusOr<std::vector<float>> GatherShards(const GatherOptions& options,
                                                const ModelLayout& layout,
                                                int count, int64_t step,
                                                int own_index,
                                                const std::vector<float>& own) {
  if (own.size() !=
      static_cast<size_t>(ShardRanges(layout, count)[own_index].length)) {
    return absl::InternalError("this shard's weights do not fit its range");
  }
  Collection collection(options, layout, count, step, own_index, own);
  for (;;) {
    RETURN_IF_ERROR(collection.AskRound());
    const std::vector<int> missing = collection.Missing();
    if (missing.empty()) break;
    RETURN_IF_ERROR(collection.CheckProgress(missing));
    absl::SleepFor(absl::Milliseconds(100));  // a shard still catching up
  }
  return collection.TakeParams();
}

void ReleaseShards(const GatherOptions& options, int num_params, int64_t step) {
  for (const std::string& address : options.addresses) {
    ShardClient shard(address, num_params, options.credentials,
                      options.server_name, options.auth_token);
    (void)shard.Release(step);
  }
}

}  // namespace dp
