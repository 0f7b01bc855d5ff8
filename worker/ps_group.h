// The job's dp-ps shards as one parameter server. Each shard owns a range
// of the vector (common/shard_plan.h); every push goes to the other shards
// first and then to shard 0, which leads the step (it hands out the blocks
// and waits for the step); the new weights come from every shard
// concurrently. Shard 0 speaks for the job (status, evaluations, ranks).
// Joining keeps the shards at one step: when a shard restarted from an older
// checkpoint, every shard rolls back to the newest step they can all restore,
// and the workers redo the steps after it (same data, same weights: the same
// model to the bit). One address means one dp-ps and the calls pass straight
// through.
#ifndef DP_WORKER_PS_GROUP_H_
#define DP_WORKER_PS_GROUP_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_layout.h"
#include "common/parallel_for.h"
#include "worker/ps_client.h"

namespace dp {

// --ps as a list: "a:1,b:2"; or one host:port whose name resolves to
// several addresses of one family (a headless Service): one entry per
// address. A name with one address per family (localhost: 127.0.0.1 and
// ::1) stays a name.
std::vector<std::string> ExpandPsAddresses(const std::string& flag);

// One address a name resolved to (numeric).
struct ResolvedAddress {
  bool ipv6 = false;
  std::string ip;
};
// The dp-ps that `entry` (host:port) names, from the addresses its host
// resolved to: when one family has several, each is a shard ("ipv4:a:port",
// IPv4 first); otherwise `entry` is one dp-ps.
std::vector<std::string> ShardsOfResolvedName(
    const std::string& entry, const std::string& port,
    const std::vector<ResolvedAddress>& resolved);

class PsGroup {
 public:
  // options.address is ignored: one client per entry of `addresses`.
  PsGroup(std::vector<std::string> addresses, const PsClientOptions& options);
  ~PsGroup();

  // Shard 0's status (the job's), or the first that answers before the
  // shards are known.
  absl::StatusOr<JobStatus> GetStatus();
  // Registers with every shard, checks that they are the shards of one job
  // (same plan, ranges that tile the vector) and brings them to one step:
  // the step returned, whose weights Pull then fetches.
  absl::StatusOr<JobStatus> Register(const RegistrationRequest& registration);
  // Every shard's tensors go through shared memory.
  bool shared_memory() const;
  // Every shard's steps go through its step channel (no call per step).
  bool step_channels() const;
  std::string why_not_shared_memory() const;
  // One dp-ps only: its gradient slot (see PsClient); empty otherwise.
  absl::Span<char> GradientSlot() const;
  absl::Status Pull(int rank, Weights* weights);
  absl::Status Push(const Gradient& gradient, int64_t* sent_bytes);
  // Shard 0's barrier: *work empty once `step` is applied, else a block of
  // it to compute.
  absl::Status Barrier(int rank, int64_t step, Block* work);
  absl::Status PushPull(const Gradient& gradient, Weights* weights,
                        int64_t* sent_bytes);
  absl::Status ReportEval(int rank, const EvalReport& report);
  // After computing from the last weights received: ABORTED when a shard's
  // buffer that some of them were read in place from was rewritten since
  // (PsClient::CheckInPlaceWeights).
  absl::Status CheckInPlaceWeights() const;
  // The ranks whose block of `step` some shard still lacks, or that the
  // step waits for to join (a shard past `step` lacks none); NOT_FOUND when
  // a shard is at an earlier step.
  absl::StatusOr<std::vector<int>> Unpushed(int64_t step, int world_size);
  int shards() const { return static_cast<int>(clients_.size()); }
  std::string address() const;

 private:
  // Runs call(shard) for every shard (but shard 0 when !with_leader),
  // concurrently; the first error, if any (by shard order).
  absl::Status ForEachShard(absl::FunctionRef<absl::Status(int shard)> call,
                            bool with_leader = true);
  // The weights of `version` from every shard but 0, into `all`.
  absl::Status PullFollowers(int rank, int64_t version, absl::Span<float> all,
                             std::vector<Received>* received);
  // The push to every shard but 0 (none for an idle one).
  absl::Status PushToFollowers(const Gradient& gradient,
                               std::vector<int64_t>* sent);
  // Whether shards that registration found apart (`all`, by shard) were
  // only seen apart: the job moved on while they were asked in turn.
  bool MovedWhileRegistering(const std::vector<JobStatus>& all);
  // Shard 0, asked now, is past `step` (false if it does not answer).
  bool LeaderPast(int64_t step);
  // One round of Register: the statuses by shard index (`leader`: the
  // answer shard(0) gave already, not asked again).
  absl::StatusOr<std::vector<JobStatus>> RegisterAll(
      const RegistrationRequest& registration,
      const JobStatus* leader = nullptr);
  // attempt() until it answers other than RESOURCE_EXHAUSTED (no rank free,
  // or the rank held by another live process) or `give_up` passes, saying
  // the first such answer.
  static absl::StatusOr<JobStatus> StandBy(
      absl::FunctionRef<absl::StatusOr<JobStatus>()> attempt,
      absl::Time give_up);
  // Rolls every shard not at `target` back to it, on the generation it
  // answered in `all` (by shard index).
  absl::Status RollBack(const std::vector<JobStatus>& all, int64_t target);
  PsClient& shard(int k) { return *clients_[order_[k]]; }
  // One version from every shard, or ABORTED; then where each tensor lies.
  absl::Status Combine(const std::vector<Received>& received,
                       Weights* weights) const;

  ModelLayout layout_;  // the job's, as of the last RegisterAll
  int64_t num_params_;  // of the whole model
  std::vector<std::unique_ptr<PsClient>> clients_;  // by address
  std::vector<int> order_;  // client of shard k, as of the last Register
  WorkerPool pool_;
  // The version Pull fetches after a join: the shards ahead by one serve
  // the one before theirs.
  std::optional<int64_t> join_version_;
  const absl::Duration retry_for_;  // of any rank to free up (any_rank)
};

}  // namespace dp

#endif  // DP_WORKER_PS_GROUP_H_
