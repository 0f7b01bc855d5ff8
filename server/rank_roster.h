// Who holds each rank of a job: registrations and their sessions, the
// processes' worker ids, closed connections, leases and losses, and who was
// told that the job failed. A plain class, like the coordinator's other
// parts: StepCoordinator calls it under its one mutex (requires: that mutex
// held), so it adds no lock to reason about.
#ifndef DP_SERVER_RANK_ROSTER_H_
#define DP_SERVER_RANK_ROSTER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace dp {

// A change in a rank's lease (RankRoster::CheckLeases). A registered rank is
// "missing" once it has made no call for the timeout while not waiting in a
// call, or once its connection closed; "back" when it calls again in time.
struct LeaseEvent {
  int rank;
  enum Kind { kMissing, kBack, kNeverRegistered } kind;
  absl::Duration silent;  // how long it has been (kBack: was) silent
  bool closed = false;    // kMissing: its connection closed
};

class RankRoster {
 public:
  // `world` ranks, none registered; their leases start at `start`.
  RankRoster(int world, absl::Time start);

  int world() const { return static_cast<int>(registered_.size()); }
  int num_registered() const;
  bool registered(int rank) const { return registered_[rank]; }
  bool lost(int rank) const { return lost_[rank]; }
  bool closed(int rank) const { return closed_[rank]; }
  uint64_t session(int rank) const { return sessions_[rank]; }
  const std::string& worker_id(int rank) const { return worker_ids_[rank]; }
  absl::Time last_seen(int rank) const { return last_seen_[rank]; }

  // Registered and not lost: it takes part in the steps.
  bool Live(int rank) const { return registered_[rank] && !lost_[rank]; }
  // Its lease ran out at `now` (`waiting`: it waits in a call, which is
  // taking part), or its connection closed.
  bool Missing(int rank, absl::Time now, bool waiting,
               absl::Duration timeout) const {
    return closed_[rank] || (!waiting && now - last_seen_[rank] > timeout);
  }
  // Its process holds it: live, and not missing by `lease`. Only that
  // process may register it again.
  bool Held(int rank, absl::Time now, bool waiting,
            absl::Duration lease) const {
    return Live(rank) && !Missing(rank, now, waiting, lease);
  }
  // The ranks held now that have attended (an Attend call came, in this
  // registration or an earlier one of the rank: a worker that registers
  // again attends again at once), by rank: those whose going will be seen.
  // A rank whose process was killed between its first registration and its
  // Attend holds it unseen until the lease runs out: it is not among them.
  std::vector<int> AttendingRanks(absl::Time now,
                                  const std::vector<bool>& waiting,
                                  absl::Duration lease) const;

  // The rank a worker that asked for none gets: the one its worker id
  // registered before, else `preferred` if free, else the lowest never
  // registered, else the lowest no process holds; -1 if every rank is held.
  int Choose(absl::string_view worker_id, int preferred, absl::Time now,
             const std::vector<bool>& waiting, absl::Duration lease) const;

  // RESOURCE_EXHAUSTED, naming the holder, when another process than
  // `worker_id`'s holds `rank` (only the holder may register a held rank
  // again).
  absl::Status CheckFree(int rank, absl::string_view worker_id, absl::Time now,
                         bool waiting, absl::Duration lease) const;
  // A registration of `rank` by `worker_id`: a new session (returned), its
  // connection open, its lease renewed at `now`.
  uint64_t Register(int rank, absl::string_view worker_id, absl::Time now);
  // FAILED_PRECONDITION unless `rank` has registered.
  absl::Status CheckRegistered(int rank) const;
  // An Attend call of `rank`'s registration came.
  void Attended(int rank) { attended_[rank] = true; }
  // An Attend call naming `session` came: Attended when that is the rank's
  // registration, else FAILED_PRECONDITION saying why it is not.
  absl::Status Attend(int rank, uint64_t session);
  // The connection of `rank`'s registration `session` closed: false, and
  // nothing changes, when that is no longer the rank's registration.
  bool Close(int rank, uint64_t session);
  // An accepted call of `rank` at `now` renews its lease. A rank lost to
  // silence is live again; one whose connection closed stays lost until it
  // registers again: a call handled after the close may be the dead
  // process's last (a push read from shared memory), no sign of life.
  void Renew(int rank, absl::Time now);
  void MarkLost(int rank) { lost_[rank] = true; }

  // The job failed and `rank` heard of it.
  void Tell(int rank) { told_[rank] = true; }
  // Every live rank whose connection is open heard of the failure.
  bool AllTold() const;

  // The lease events since the last call (see LeaseEvent), as of `now`:
  // ranks that never registered within `timeout` once; with `reassign` a
  // missing rank is also lost (its blocks go to the others).
  std::vector<LeaseEvent> CheckLeases(absl::Time now,
                                      const std::vector<bool>& waiting,
                                      absl::Duration timeout, bool reassign);

  // The whole state by rank, for tests' mirrors.
  const std::vector<bool>& registered_ranks() const { return registered_; }
  const std::vector<bool>& lost_ranks() const { return lost_; }
  const std::vector<bool>& closed_ranks() const { return closed_; }
  const std::vector<std::string>& worker_ids() const { return worker_ids_; }
  const std::vector<uint64_t>& sessions() const { return sessions_; }
  const std::vector<absl::Time>& leases() const { return last_seen_; }
  const std::vector<bool>& told() const { return told_; }
  const std::vector<bool>& attended() const { return attended_; }
  // What CheckLeases reported last, by rank: missing, and never registered.
  const std::vector<bool>& reported_missing() const {
    return reported_missing_;
  }
  const std::vector<bool>& reported_unregistered() const {
    return reported_unregistered_;
  }

 private:
  // All by rank.
  std::vector<bool> registered_;
  std::vector<std::string> worker_ids_;
  // Its current registration's session (Attend), and whether that one's
  // connection closed.
  std::vector<uint64_t> sessions_;
  std::vector<bool> attended_;  // in any of its registrations
  std::vector<bool> closed_;
  // Lost: missing with a block the step needed (its blocks go to others).
  std::vector<bool> lost_;
  std::vector<absl::Time> last_seen_;  // the leases
  std::vector<bool> told_;             // of the failure
  // What CheckLeases has reported.
  std::vector<bool> reported_missing_;
  std::vector<absl::Time> missing_since_;
  std::vector<bool> reported_unregistered_;
};

// Unique with overwhelming probability (a generation per start and
// rollback, a session per registration); never 0 (a request without one).
uint64_t RandomId();

}  // namespace dp

#endif  // DP_SERVER_RANK_ROSTER_H_
