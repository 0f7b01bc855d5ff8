// The test mirror of a StepCoordinator, kept apart from its logic.
#include "server/coordinator_mirror.h"

#include <cstring>

#include "absl/strings/str_join.h"

namespace dp {

StepCoordinator::ObservableState StepCoordinator::Observe() const {
  absl::ReaderMutexLock lock(&mu_);
  ObservableState o;
  o.training = state_;
  o.config = config_;
  if (data_.known()) o.data = data_.fingerprint();
  o.registered = roster_.registered_ranks();
  o.received = planner_.pushed();
  o.sums = sums_.Sums();
  o.losses = sums_.Losses();
  o.plan = planner_.plan();
  o.work = planner_.work();
  o.lost = roster_.lost_ranks();
  o.holders = roster_.worker_ids();
  o.sessions = roster_.sessions();
  o.closed = roster_.closed_ranks();
  o.last_seen = roster_.leases();
  o.told = roster_.told();
  o.attended = roster_.attended();
  o.reported_missing = roster_.reported_missing();
  o.reported_unregistered = roster_.reported_unregistered();
  o.stragglers = planner_.stragglers();
  o.backed_up = planner_.backed_up();
  o.backups_this_step = planner_.backups_this_step();
  o.waiters = waits_.List();
  o.has_eval = evals_.has();
  o.final_eval = evals_.final_came();
  o.last_eval = evals_.last();
  o.shutdown = shutdown_;
  o.failed = failed_;
  return o;
}

std::string ObservableDifferences(const CoordinatorMirror& a,
                                  const CoordinatorMirror& b) {
  auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
    // memcmp must not see the null data() of an empty vector.
    return x.size() == y.size() &&
           (x.empty() ||
            std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
  };
  std::vector<std::string> diff;
  auto check = [&diff](bool equal, const char* name) {
    if (!equal) diff.push_back(name);
  };
  check(a.training.step == b.training.step, "step");
  check(same(a.training.params, b.training.params), "params");
  check(same(a.training.m, b.training.m), "adam m");
  check(same(a.training.v, b.training.v), "adam v");
  check(a.config == b.config, "config");
  check(a.data.has_value() == b.data.has_value() &&
            (!a.data.has_value() || *a.data == *b.data),
        "data fingerprint");
  check(a.registered == b.registered, "registrations");
  check(a.received == b.received, "received pushes");
  check(same(a.losses, b.losses), "losses");
  bool sums = a.sums.size() == b.sums.size();
  for (size_t i = 0; sums && i < a.sums.size(); ++i) {
    sums = a.sums[i].first == b.sums[i].first &&
           same(a.sums[i].second, b.sums[i].second);
  }
  check(sums, "received sums");
  check(a.plan == b.plan && a.work == b.work, "plan");
  check(a.lost == b.lost, "lost ranks");
  check(a.holders == b.holders && a.sessions == b.sessions,
        "holders of the ranks");
  check(a.attended == b.attended && a.closed == b.closed,
        "attendance and closed connections");
  check(a.last_seen == b.last_seen, "leases");
  check(a.told == b.told, "told of the failure");
  check(a.reported_missing == b.reported_missing &&
            a.reported_unregistered == b.reported_unregistered,
        "reported losses");
  check(a.stragglers == b.stragglers, "stragglers");
  check(
      a.backed_up == b.backed_up && a.backups_this_step == b.backups_this_step,
      "backups");
  check(a.waiters == b.waiters, "waiters");
  const EvalReport& x = a.last_eval;
  const EvalReport& y = b.last_eval;
  check(a.has_eval == b.has_eval && a.final_eval == b.final_eval &&
            x.step == y.step && x.epoch == y.epoch &&
            std::memcmp(&x.accuracy, &y.accuracy, sizeof(double)) == 0 &&
            std::memcmp(&x.loss, &y.loss, sizeof(double)) == 0 &&
            x.num_samples == y.num_samples && x.final == y.final,
        "evaluation");
  check(a.shutdown == b.shutdown, "shutdown");
  check(a.failed == b.failed, "failure");
  return absl::StrJoin(diff, ", ");
}

}  // namespace dp
