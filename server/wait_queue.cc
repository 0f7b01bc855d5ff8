// The waits of a step coordinator.
#include "server/wait_queue.h"

namespace dp {

WaitQueue::Taken WaitQueue::TakeOut(std::map<int64_t, Waiter>::iterator& it) {
  Taken taken{it->second.rank, it->second.step, std::move(it->second.done)};
  --of_rank_[taken.rank];
  it = waiters_.erase(it);
  return taken;
}

int64_t WaitQueue::Add(int rank, int64_t step, Callback done, int max_per_rank,
                       Callback* evicted) {
  if (of_rank_[rank] >= max_per_rank) {
    for (auto it = waiters_.begin(); it != waiters_.end(); ++it) {
      if (it->second.rank == rank) {  // the oldest: ids grow with time
        *evicted = TakeOut(it).done;
        break;
      }
    }
  }
  const int64_t id = next_id_++;
  waiters_.emplace(id, Waiter{rank, step, std::move(done)});
  ++of_rank_[rank];
  return id;
}

bool WaitQueue::Cancel(int64_t id) {
  auto it = waiters_.find(id);
  if (it == waiters_.end()) return false;
  TakeOut(it);
  return true;
}

std::vector<WaitQueue::Taken> WaitQueue::TakeWhere(
    absl::FunctionRef<bool(int rank, int64_t step)> take) {
  std::vector<Taken> taken;
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (take(it->second.rank, it->second.step)) {
      taken.push_back(TakeOut(it));
    } else {
      ++it;
    }
  }
  return taken;
}

std::optional<WaitQueue::Taken> WaitQueue::TakeFirst(
    absl::FunctionRef<bool(int rank, int64_t step)> take) {
  for (auto it = waiters_.begin(); it != waiters_.end(); ++it) {
    if (take(it->second.rank, it->second.step)) return TakeOut(it);
  }
  return std::nullopt;
}

std::vector<WaitQueue::Taken> WaitQueue::TakeAll() {
  return TakeWhere([](int, int64_t) { return true; });
}

bool WaitQueue::Any(
    absl::FunctionRef<bool(int rank, int64_t step)> which) const {
  for (const auto& [id, w] : waiters_) {
    if (which(w.rank, w.step)) return true;
  }
  return false;
}

std::vector<bool> WaitQueue::Waiting() const {
  std::vector<bool> waiting(of_rank_.size(), false);
  for (const auto& [id, w] : waiters_) waiting[w.rank] = true;
  return waiting;
}

std::vector<std::pair<int, int64_t>> WaitQueue::List() const {
  std::vector<std::pair<int, int64_t>> list;
  for (const auto& [id, w] : waiters_) list.emplace_back(w.rank, w.step);
  return list;
}

}  // namespace dp
