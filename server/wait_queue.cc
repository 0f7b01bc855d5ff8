// The waits of a step coordinator.
#include "server/wait_queue.h"

#include "absl/strings/str_format.h"

namespace dp {

WaitQueue::Taken WaitQueue::TakeOut(std::map<int64_t, Waiter>::iterator& it) {
  Taken taken{it->second.rank, it->second.step, std::move(it->second.done)};
  --of_rank_[taken.rank];
  it = waiters_.erase(it);
  return taken;
}

int64_t WaitQueue::Add(int rank, int64_t step, Callback done, int max_per_rank,
                       std::vector<Wake>* evicted) {
  if (of_rank_[rank] >= max_per_rank) {
    for (auto it = waiters_.begin(); it != waiters_.end(); ++it) {
      if (it->second.rank == rank) {  // the oldest: ids grow with time
        evicted->push_back(
            Wake{TakeOut(it).done,
                 absl::AbortedError(absl::StrFormat(
                     "rank %d has more than %d calls waiting: the oldest is "
                     "dropped",
                     rank, max_per_rank)),
                 step,
                 {}});
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

void WaitQueue::Run(std::vector<Wake>& wakes) {
  for (Wake& w : wakes) w.done(w.status, w.step, w.work);
}

std::vector<WaitQueue::Wake> WaitQueue::WakeApplied(int64_t step) {
  std::vector<Wake> wakes;
  for (Taken& t : TakeWhere([&](int, int64_t s) { return s < step; })) {
    wakes.push_back(Wake{std::move(t.done), absl::OkStatus(), step, {}});
  }
  return wakes;
}

std::vector<WaitQueue::Wake> WaitQueue::WakeWithWork(
    int64_t step, absl::FunctionRef<Block(int rank)> work) {
  std::vector<Block> works;  // of the waits taken, in their order
  std::vector<Taken> taken = TakeWhere([&](int rank, int64_t s) {
    if (s != step) return false;
    const Block b = work(rank);
    if (b.empty()) return false;
    works.push_back(b);
    return true;
  });
  std::vector<Wake> wakes;
  for (size_t i = 0; i < taken.size(); ++i) {
    wakes.push_back(
        Wake{std::move(taken[i].done), absl::OkStatus(), step, works[i]});
  }
  return wakes;
}

std::vector<WaitQueue::Wake> WaitQueue::WakeAll(const absl::Status& status,
                                                int64_t step) {
  std::vector<Wake> wakes;
  for (Taken& t : TakeAll()) {
    wakes.push_back(Wake{std::move(t.done), status, step, {}});
  }
  return wakes;
}

}  // namespace dp
