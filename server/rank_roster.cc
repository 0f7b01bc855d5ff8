// Who holds each rank: registrations, sessions, connections and leases.
#include "server/rank_roster.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_format.h"

namespace dp {

uint64_t RandomId() {
  std::random_device device;
  const uint64_t g = (uint64_t{device()} << 32) | device();
  return g == 0 ? 1 : g;
}

RankRoster::RankRoster(int world, absl::Time start)
    : registered_(world, false),
      worker_ids_(world),
      sessions_(world, 0),
      attended_(world, false),
      closed_(world, false),
      lost_(world, false),
      last_seen_(world, start),
      told_(world, false),
      reported_missing_(world, false),
      missing_since_(world, start),
      reported_unregistered_(world, false) {}

int RankRoster::num_registered() const {
  return static_cast<int>(
      std::count(registered_.begin(), registered_.end(), true));
}

std::vector<int> RankRoster::AttendingRanks(absl::Time now,
                                            const std::vector<bool>& waiting,
                                            absl::Duration lease) const {
  std::vector<int> held;
  for (int r = 0; r < world(); ++r) {
    if (attended_[r] && Held(r, now, waiting[r], lease)) held.push_back(r);
  }
  return held;
}

absl::Status RankRoster::CheckRegistered(int rank) const {
  if (registered_[rank]) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrFormat("rank %d has not registered", rank));
}

absl::Status RankRoster::Attend(int rank, uint64_t session) {
  if (!registered_[rank] || sessions_[rank] != session) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "Attend: session %016x is not rank %d's registration (%s)", session,
        rank, registered_[rank] ? "it registered again" : "not registered"));
  }
  Attended(rank);
  return absl::OkStatus();
}

int RankRoster::Choose(absl::string_view worker_id, int preferred,
                       absl::Time now, const std::vector<bool>& waiting,
                       absl::Duration lease) const {
  for (int r = 0; r < world() && !worker_id.empty(); ++r) {
    if (registered_[r] && worker_ids_[r] == worker_id) return r;
  }
  if (preferred >= 0 && preferred < world() &&
      !Held(preferred, now, waiting[preferred], lease)) {
    return preferred;
  }
  for (int r = 0; r < world(); ++r) {
    if (!registered_[r]) return r;
  }
  for (int r = 0; r < world(); ++r) {
    if (!Held(r, now, waiting[r], lease)) return r;
  }
  return -1;
}

absl::Status RankRoster::CheckFree(int rank, absl::string_view worker_id,
                                   absl::Time now, bool waiting,
                                   absl::Duration lease) const {
  if (!Held(rank, now, waiting, lease) || worker_ids_[rank] == worker_id) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrFormat(
      "rank %d is held by a live process (%s, %s); it is free once that one "
      "is lost (its connection closes, or it makes no call for %s)",
      rank, worker_ids_[rank].empty() ? "unnamed" : worker_ids_[rank],
      waiting ? std::string("waiting in a call")
              : absl::StrFormat("its last call %.1f s ago",
                                absl::ToDoubleSeconds(now - last_seen_[rank])),
      absl::FormatDuration(lease)));
}

uint64_t RankRoster::Register(int rank, absl::string_view worker_id,
                              absl::Time now) {
  registered_[rank] = true;
  worker_ids_[rank] = std::string(worker_id);
  sessions_[rank] = RandomId();
  closed_[rank] = false;  // the new session's connection is open
  Renew(rank, now);
  return sessions_[rank];
}

bool RankRoster::Close(int rank, uint64_t session) {
  // A registration since (the process came back): nothing happened.
  if (!registered_[rank] || sessions_[rank] != session) return false;
  closed_[rank] = true;  // the rank is free for another process
  return true;
}

void RankRoster::Renew(int rank, absl::Time now) {
  last_seen_[rank] = now;
  if (!closed_[rank]) lost_[rank] = false;
}

bool RankRoster::AllTold() const {
  // A rank whose connection closed can be told nothing more.
  for (int r = 0; r < world(); ++r) {
    if (Live(r) && !closed_[r] && !told_[r]) return false;
  }
  return true;
}

std::vector<LeaseEvent> RankRoster::CheckLeases(
    absl::Time now, const std::vector<bool>& waiting, absl::Duration timeout,
    bool reassign) {
  std::vector<LeaseEvent> events;
  for (int r = 0; r < world(); ++r) {
    const absl::Duration silent = now - last_seen_[r];
    if (!registered_[r]) {
      if (silent > timeout && !reported_unregistered_[r]) {
        reported_unregistered_[r] = true;
        events.push_back({r, LeaseEvent::kNeverRegistered, silent});
      }
      continue;
    }
    // Waiting in a call (barrier) is taking part; otherwise a rank calls at
    // least once per block it computes. A closed connection says at once
    // what silence says only after the timeout.
    const bool missing = Missing(r, now, waiting[r], timeout);
    if (missing && !reported_missing_[r]) {
      reported_missing_[r] = true;
      if (reassign) lost_[r] = true;
      missing_since_[r] = last_seen_[r];
      events.push_back({r, LeaseEvent::kMissing, silent, closed_[r]});
    } else if (!missing && reported_missing_[r] && silent <= timeout) {
      reported_missing_[r] = false;
      events.push_back(
          {r, LeaseEvent::kBack, last_seen_[r] - missing_since_[r]});
    }
  }
  return events;
}

}  // namespace dp
