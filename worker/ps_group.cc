// The shards of a job behind one interface; joining rolls them back to one
// step when they disagree.
#include "worker/ps_group.h"

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/job_failure.h"
#include "common/log.h"
#include "common/model_layout.h"
#include "common/shared_memory.h"
#include "common/status_macros.h"
#include "worker/backend.h"

namespace dp {
namespace {

// Rounds of register-and-roll-back before a join gives up: each round that
// does not settle means a shard changed (restarted, rolled back by another
// worker) while this one looked.
constexpr int kMaxJoinRounds = 20;

// How often a worker standing by for a rank asks again.
constexpr absl::Duration kStandByPoll = absl::Milliseconds(250);

// The newest step <= limit that shard k can be at: its own step, or one it
// can restore. -1 when there is none (step 0 always is).
int64_t CommonStep(const std::vector<JobStatus>& shards, int64_t limit) {
  std::set<int64_t> candidates;
  for (const JobStatus& s : shards) {
    candidates.insert(s.step);
    candidates.insert(s.shard.restorable_steps.begin(),
                      s.shard.restorable_steps.end());
  }
  candidates.insert(0);
  for (auto it = candidates.rbegin(); it != candidates.rend(); ++it) {
    const int64_t step = *it;
    if (step > limit) continue;
    bool everywhere = true;
    for (const JobStatus& s : shards) {
      const auto& r = s.shard.restorable_steps;
      everywhere =
          everywhere && (s.step == step || step == 0 ||
                         std::find(r.begin(), r.end(), step) != r.end());
    }
    if (everywhere) return step;
  }
  return -1;
}

// "3,3,2": the shards' steps, by shard.
std::string StepsOf(const std::vector<JobStatus>& all) {
  std::vector<std::string> steps;
  for (const JobStatus& s : all) steps.push_back(absl::StrCat(s.step));
  return absl::StrJoin(steps, ",");
}

}  // namespace

std::vector<std::string> ShardsOfResolvedName(
    const std::string& entry, const std::string& port,
    const std::vector<ResolvedAddress>& resolved) {
  // One list per family: "localhost" is 127.0.0.1 and ::1, one dp-ps.
  std::vector<std::string> v4, v6;
  for (const ResolvedAddress& a : resolved) {
    std::vector<std::string>& family = a.ipv6 ? v6 : v4;
    const std::string address = a.ipv6
                                    ? absl::StrCat("ipv6:[", a.ip, "]:", port)
                                    : absl::StrCat("ipv4:", a.ip, ":", port);
    if (std::find(family.begin(), family.end(), address) == family.end()) {
      family.push_back(address);
    }
  }
  if (v4.size() > 1) return v4;
  if (v6.size() > 1) return v6;
  return {entry};
}

std::vector<std::string> ExpandPsAddresses(const std::string& flag) {
  std::vector<std::string> list;
  for (absl::string_view entry :
       absl::StrSplit(flag, ',', absl::SkipWhitespace())) {
    list.emplace_back(absl::StripAsciiWhitespace(entry));
  }
  if (list.size() != 1) return list;
  const std::string& entry = list[0];
  const size_t colon = entry.rfind(':');
  if (colon == std::string::npos || entry.find('/') != std::string::npos ||
      entry.find('[') != std::string::npos) {
    return list;  // not host:port (a gRPC URI, IPv6): as given
  }
  const std::string host = entry.substr(0, colon);
  const std::string port = entry.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0) {
    return list;  // the channel reports what is wrong, with retries
  }
  std::vector<ResolvedAddress> resolved;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char ip[NI_MAXHOST];
    if (getnameinfo(a->ai_addr, a->ai_addrlen, ip, sizeof(ip), nullptr, 0,
                    NI_NUMERICHOST) != 0) {
      continue;
    }
    resolved.push_back({a->ai_family == AF_INET6, ip});
  }
  freeaddrinfo(found);
  return ShardsOfResolvedName(entry, port, resolved);
}

PsGroup::PsGroup(std::vector<std::string> addresses,
                 const PsClientOptions& options)
    // Until the first RegisterAll says which model the job trains.
    : layout_(ModelLayout::SimpleNet()),
      num_params_(layout_.num_params()),
      pool_(static_cast<int>(addresses.size())),
      retry_for_(options.retry_for) {
  for (const std::string& address : addresses) {
    PsClientOptions o = options;
    o.address = address;
    clients_.push_back(std::make_unique<PsClient>(o));
  }
  for (size_t k = 0; k < clients_.size(); ++k) order_.push_back(k);
}

PsGroup::~PsGroup() = default;

std::string PsGroup::address() const {
  std::vector<std::string> all;
  for (const auto& c : clients_) all.push_back(c->address());
  return absl::StrJoin(all, ",");
}

absl::Status PsGroup::ForEachShard(
    absl::FunctionRef<absl::Status(int shard)> call, bool with_leader) {
  std::vector<absl::Status> results(clients_.size());
  pool_.ParallelFor(static_cast<int64_t>(clients_.size()), 1,
                    [&](int64_t begin, int64_t end) {
                      for (int64_t k = begin; k < end; ++k) {
                        if (k == 0 && !with_leader) continue;
                        results[k] = call(static_cast<int>(k));
                      }
                    });
  // The job's end first: nothing else matters then.
  for (const absl::Status& s : results) {
    if (IsJobFailed(s)) return s;
  }
  for (const absl::Status& s : results) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<JobStatus> PsGroup::GetStatus() {
  absl::Status last;
  std::optional<JobStatus> first;
  for (int k = 0; k < shards(); ++k) {
    absl::StatusOr<JobStatus> s = shard(k).GetStatus();
    if (!s.ok()) {
      last = s.status();
      continue;
    }
    if (s->shard.spec.index == 0) return s;
    if (!first.has_value()) first = *std::move(s);
  }
  if (first.has_value()) return *first;
  return last;
}

absl::StatusOr<std::vector<JobStatus>> PsGroup::RegisterAll(
    const RegistrationRequest& registration, const JobStatus* leader) {
  const int n = shards();
  std::vector<JobStatus> by_address(n);
  RETURN_IF_ERROR(ForEachShard([&](int a) -> absl::Status {
    if (leader != nullptr && a == order_[0]) {
      by_address[a] = *leader;
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(by_address[a], clients_[a]->Register(registration));
    return absl::OkStatus();
  }));
  std::vector<int> order(n, -1);
  for (int a = 0; a < n; ++a) {
    const ShardSpec& spec = by_address[a].shard.spec;
    if (spec.count != n) {
      return absl::FailedPreconditionError(
          absl::StrFormat("--ps names %d dp-ps address(es), but %s is %s", n,
                          clients_[a]->address(), spec.ToString()));
    }
    if (order[spec.index] >= 0) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s and %s are both shard %d", clients_[order[spec.index]]->address(),
          clients_[a]->address(), spec.index));
    }
    order[spec.index] = a;
  }
  std::vector<JobStatus> by_shard(n);
  int64_t end = 0;
  // The job's model, as shard 0 has it (every shard's config is the same,
  // checked below); the trainer has checked the widths.
  const JobConfig& job = by_address[order[0]].config;
  ASSIGN_OR_RETURN(ModelLayout layout, JobMlp(job));
  for (int k = 0; k < n; ++k) {
    by_shard[k] = std::move(by_address[order[k]]);
    const JobStatus& s = by_shard[k];
    if (s.shard.spec.range.offset != end || !(s.config == by_shard[0].config)) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s (%s) is not a shard of the job shard 0 (%s) runs",
          clients_[order[k]]->address(), s.shard.spec.ToString(),
          clients_[order[0]]->address()));
    }
    end = s.shard.spec.range.end();
  }
  if (end != layout.num_params()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("the shards hold [0, %d) of the model's %d parameters",
                        end, layout.num_params()));
  }
  layout_ = std::move(layout);
  num_params_ = layout_.num_params();
  order_ = std::move(order);
  return by_shard;
}

namespace {

// What a join does with the steps the shards answered.
struct JoinPlan {
  // True: join at `step`; false: roll every shard back to `step` first.
  bool join = true;
  int64_t step = 0;
  // The version Pull fetches, when the shards ahead by one serve the one
  // before theirs.
  std::optional<int64_t> version;
};

// Shards at one step: join there. A step applied on other shards and still
// waiting on shard 0 (for this worker's push, perhaps): join at the older
// one. Otherwise the newest step every shard is at or can restore;
// FAILED_PRECONDITION when there is none.
absl::StatusOr<JoinPlan> PlanJoin(const std::vector<JobStatus>& all) {
  int64_t lo = all[0].step, hi = all[0].step;
  for (const JobStatus& s : all) {
    lo = std::min(lo, s.step);
    hi = std::max(hi, s.step);
  }
  bool ahead_hold_previous = true;
  for (const JobStatus& s : all) {
    if (s.step != lo) ahead_hold_previous &= s.shard.holds_previous;
  }
  if (hi == lo) return JoinPlan{true, lo, std::nullopt};
  // Only while shard 0 is at the older step: it plans that step's blocks,
  // which the shards behind it still need. Shard 0 ahead would plan the
  // next step and nobody would compute the older one.
  if (hi == lo + 1 && ahead_hold_previous && all[0].step == lo) {
    return JoinPlan{true, lo, lo};
  }
  const int64_t target = CommonStep(all, lo);
  if (target < 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the shards are at steps %s and share no step to roll back to",
        StepsOf(all)));
  }
  return JoinPlan{false, target, std::nullopt};
}

}  // namespace

bool PsGroup::MovedWhileRegistering(const std::vector<JobStatus>& all) {
  // Shard 0 is asked first. A follower is never behind shard 0 and never
  // more than a step ahead of it at any one time, so followers that
  // answered later at or after its step, with shard 0 past the step it
  // answered now, are a job that moved on meanwhile - not a shard that
  // restarted behind the others (that one is behind shard 0, or shard 0
  // is, and stays there: the job cannot move without it).
  for (const JobStatus& s : all) {
    if (s.step < all[0].step) return false;
  }
  return LeaderPast(all[0].step);
}

bool PsGroup::LeaderPast(int64_t step) {
  absl::StatusOr<JobStatus> leader = shard(0).GetStatus();
  return leader.ok() && leader->step > step;
}

absl::Status PsGroup::RollBack(const std::vector<JobStatus>& all,
                               int64_t target) {
  return ForEachShard([&](int k) -> absl::Status {
    if (all[k].step == target) return absl::OkStatus();
    return shard(k).Rollback(target, all[k].shard.generation).status();
  });
}

absl::StatusOr<JobStatus> PsGroup::StandBy(
    absl::FunctionRef<absl::StatusOr<JobStatus>()> attempt,
    absl::Time give_up) {
  absl::StatusOr<JobStatus> answer = attempt();
  bool said = false;
  while (answer.status().code() == absl::StatusCode::kResourceExhausted &&
         absl::Now() < give_up) {
    if (!said) Log("%s; standing by", answer.status().message());
    said = true;
    absl::SleepFor(kStandByPoll);
    answer = attempt();
  }
  return answer;
}

absl::StatusOr<JobStatus> PsGroup::Register(const RegistrationRequest& wanted) {
  join_version_.reset();
  // The leading shard (before the first join: the first listed, the same
  // for every worker) decides who has which rank: it picks a rank-less
  // worker's, and refuses a rank that another live process holds
  // (RESOURCE_EXHAUSTED). The worker stands by, asking again, and registers
  // with the other shards only once the leader admitted it: a second
  // process of a rank never takes it from them while its holder lives. A
  // rank-less worker gives up after --retry_for_s; one of a held rank waits
  // for the holder to go (kill -9 of it closes its connection: at once; a
  // silent one: its lease, --worker_timeout_s).
  const absl::Time give_up =
      wanted.any_rank ? absl::Now() + retry_for_ : absl::InfiniteFuture();
  int rank = wanted.rank;
  std::vector<JobStatus> all;
  auto attempt = [&]() -> absl::StatusOr<JobStatus> {
    ASSIGN_OR_RETURN(const JobStatus leader, shard(0).Register(wanted));
    RegistrationRequest registration = wanted;
    registration.rank = leader.rank;
    registration.any_rank = false;
    absl::StatusOr<std::vector<JobStatus>> registered =
        RegisterAll(registration, &leader);
    if (registered.status().code() == absl::StatusCode::kResourceExhausted) {
      // Another shard knows a live holder that the leader does not (it
      // restarted and has not seen it yet), or has not yet seen the
      // holder's loss: the leader's registration is given back, so that a
      // live holder gets the rank back there, and this one stands by.
      shard(0).EndAttendance();
    }
    RETURN_IF_ERROR(registered.status());
    all = *std::move(registered);
    rank = leader.rank;
    return all[0];
  };
  for (int round = 0; round < kMaxJoinRounds; ++round) {
    // Backoff: another worker may be rolling the same shards back.
    absl::SleepFor(absl::Milliseconds(10) * round);
    RETURN_IF_ERROR(StandBy(attempt, give_up).status());
    ASSIGN_OR_RETURN(JoinPlan plan, PlanJoin(all));
    if (!plan.join && MovedWhileRegistering(all)) {
      // The shards were asked one after another while the job ran on:
      // they are together, only seen apart. Join at the newest version.
      plan = JoinPlan{true, all[0].step, std::nullopt};
    }
    if (plan.join) {
      join_version_ = plan.version;
      JobStatus joined = all[0];
      joined.step = plan.step;
      joined.rank = rank;
      return joined;
    }
    Log("rank %d: the shards are at steps %s: rolling them back to step %d",
        rank, StepsOf(all), plan.step);
    // ABORTED: another worker rolled a shard back first, or the step is no
    // longer restorable there; look again.
    if (absl::Status rolled = RollBack(all, plan.step);
        !rolled.ok() && rolled.code() != absl::StatusCode::kAborted) {
      return rolled;
    }
  }
  return absl::AbortedError(absl::StrFormat(
      "the shards did not settle on one step in %d rounds", kMaxJoinRounds));
}

bool PsGroup::shared_memory() const {
  for (const auto& c : clients_) {
    if (!c->shared_memory()) return false;
  }
  return true;
}

bool PsGroup::step_channels() const {
  for (const auto& c : clients_) {
    if (!c->step_channel()) return false;
  }
  return true;
}

std::string PsGroup::why_not_shared_memory() const {
  std::vector<std::string> why;
  for (const auto& c : clients_) {
    if (!c->why_not_shared_memory().empty()) {
      why.push_back(
          clients_.size() == 1
              ? c->why_not_shared_memory()
              : absl::StrCat(c->address(), ": ", c->why_not_shared_memory()));
    }
  }
  return absl::StrJoin(why, "; ");
}

absl::Span<char> PsGroup::GradientSlot() const {
  return clients_.size() == 1 ? clients_[0]->GradientSlot()
                              : absl::Span<char>();
}

absl::Status PsGroup::Combine(const std::vector<Received>& received,
                              Weights* weights) const {
  weights->step = received[0].step;
  weights->block = received[0].block;
  weights->work_only = received[0].work_only;
  // More work on the weights held: params and tensors stay as they are.
  if (weights->work_only) return absl::OkStatus();
  weights->wire_bytes = 0;
  std::vector<std::string> steps;
  bool same = true;
  for (const Received& r : received) {
    same = same && r.step == weights->step;
    weights->wire_bytes += r.wire_bytes;
    steps.push_back(absl::StrCat(r.step));
  }
  if (!same) {
    return absl::AbortedError(
        absl::StrFormat("the shards answered with versions %s: re-sync",
                        absl::StrJoin(steps, ",")));
  }
  // A tensor lies where a shard left it in place, else in params.
  weights->tensors.clear();
  weights->in_place = false;
  for (const TensorInfo& t : layout_.tensors()) {
    absl::Span<const float> where(weights->params.data() + t.offset, t.size);
    for (const Received& r : received) {
      const int64_t at = t.offset - r.in_place_offset;
      if (!r.in_place.empty() && at >= 0 &&
          at + t.size <= static_cast<int64_t>(r.in_place.size())) {
        where = r.in_place.subspan(at, t.size);
        weights->in_place = true;
      }
    }
    weights->tensors.push_back(where);
  }
  return absl::OkStatus();
}

absl::Status PsGroup::Pull(int rank, Weights* weights) {
  weights->params.resize(num_params_);
  std::vector<Received> received(clients_.size());
  const absl::Span<float> all = absl::MakeSpan(weights->params);
  // Shard 0's version, then the same from the others: the job does not
  // wait for a worker that pulls, and they may be a step ahead by then
  // (they hold the version before theirs).
  // The join's version once: a retry asks for the current one.
  const std::optional<int64_t> version = join_version_;
  join_version_.reset();
  RETURN_IF_ERROR(shard(0).Pull(rank, version, all, &received[0]));
  RETURN_IF_ERROR(PullFollowers(rank, received[0].step, all, &received));
  return Combine(received, weights);
}

absl::Status PsGroup::PullFollowers(int rank, int64_t version,
                                    absl::Span<float> all,
                                    std::vector<Received>* received) {
  if (shards() == 1) return absl::OkStatus();
  absl::Status s = ForEachShard(
      [&](int k) { return shard(k).Pull(rank, version, all, &(*received)[k]); },
      /*with_leader=*/false);
  if (s.code() != absl::StatusCode::kAborted || IsMovedUnderRead(s)) return s;
  // A follower that no longer holds the version shard 0 gave a moment ago
  // was not behind: the job moved on in between (it does not wait for a
  // worker whose block was backed up), and shard 0 has moved too, since a
  // follower is never more than a step ahead of it. The version is merely
  // gone, as one rewritten under a read is, and pulling again gets the
  // newest; a shard behind the others stays the join's to mend.
  return LeaderPast(version) ? MarkedMovedUnderRead(s) : s;
}

absl::Status PsGroup::PushToFollowers(const Gradient& gradient,
                                      std::vector<int64_t>* sent) {
  // Every block reaches the other shards before shard 0: when shard 0 has
  // applied a step, they have every block of it too, and applied it.
  if (gradient.idle || shards() == 1) return absl::OkStatus();
  return ForEachShard(
      [&](int k) { return shard(k).Push(gradient, &(*sent)[k]); },
      /*with_leader=*/false);
}

absl::Status PsGroup::Push(const Gradient& gradient, int64_t* sent_bytes) {
  std::vector<int64_t> sent(clients_.size(), 0);
  absl::Status s = PushToFollowers(gradient, &sent);
  if (s.ok()) s = shard(0).Push(gradient, &sent[0]);
  *sent_bytes = 0;
  for (int64_t b : sent) *sent_bytes += b;
  return s;
}

absl::Status PsGroup::Barrier(int rank, int64_t step, Block* work) {
  return shard(0).Barrier(rank, step, work);
}

absl::Status PsGroup::PushPull(const Gradient& gradient, Weights* weights,
                               int64_t* sent_bytes) {
  weights->params.resize(num_params_);
  std::vector<Received> received(clients_.size());
  std::vector<int64_t> sent(clients_.size(), 0);
  const absl::Span<float> all = absl::MakeSpan(weights->params);
  absl::Status s = PushToFollowers(gradient, &sent);
  if (s.ok()) s = shard(0).PushPull(gradient, all, &received[0], &sent[0]);
  if (s.ok() && !received[0].work_only) {
    s = PullFollowers(gradient.rank, received[0].step, all, &received);
  }
  *sent_bytes = 0;
  for (int64_t b : sent) *sent_bytes += b;
  RETURN_IF_ERROR(s);
  if (received[0].work_only) received.resize(1);
  return Combine(received, weights);
}

absl::StatusOr<std::vector<int>> PsGroup::Unpushed(int64_t step,
                                                   int world_size) {
  std::vector<bool> lacking(world_size, false);
  for (int k = 0; k < shards(); ++k) {
    ASSIGN_OR_RETURN(const JobStatus s, shard(k).GetStatus());
    if (s.step > step) continue;
    if (s.step < step) {
      return absl::NotFoundError(
          absl::StrFormat("shard %d is at step %d", k, s.step));
    }
    for (int r : s.waits_for) {
      if (r >= 0 && r < world_size) lacking[r] = true;
    }
  }
  std::vector<int> ranks;
  for (int r = 0; r < world_size; ++r) {
    if (lacking[r]) ranks.push_back(r);
  }
  return ranks;
}

absl::Status PsGroup::CheckInPlaceWeights() const {
  for (const auto& c : clients_) RETURN_IF_ERROR(c->CheckInPlaceWeights());
  return absl::OkStatus();
}

absl::Status PsGroup::ReportEval(int rank, const EvalReport& report) {
  return shard(0).ReportEval(rank, report);
}

}  // namespace dp
