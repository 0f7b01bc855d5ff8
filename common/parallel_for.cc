// WorkerPool: persistent threads woken per call through one mutex.
#include "common/parallel_for.h"

#include <algorithm>
#include <chrono>

#include "common/status_macros.h"

namespace dp {
namespace {

// How long the caller polls for the other shares before it sleeps. The
// shares are equal, so they usually end within microseconds of each other,
// and a futex wake-up (plus, in a VM, an idle vCPU's wake-up) costs more
// than that: on a 2-vCPU VM a call took ~27 us more than its work without
// the poll, ~17 us with it (100 us did no better). Short enough not to
// matter to a training worker wanting the core.
constexpr std::chrono::microseconds kSpinBeforeSleep(20);

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

WorkerPool::WorkerPool(int threads) : threads_(std::max(1, threads)) {
  workers_.reserve(threads_ - 1);
  for (int i = 0; i + 1 < threads_; ++i) {
    workers_.emplace_back([this, i] { Work(i); });
  }
}

WorkerPool::~WorkerPool() {
  {
    absl::MutexLock lock(&mu_);
    DP_CHECK(!busy_);
    stop_ = true;
  }
  for (std::thread& t : workers_) t.join();
}

void WorkerPool::RunShare(const Job& job, int index) {
  // Grains [first, last) of `grains`, so shares differ by one grain at most.
  const int64_t first = job.grains * index / job.shares;
  const int64_t last = job.grains * (index + 1) / job.shares;
  (*job.fn)(first * job.grain, std::min(job.n, last * job.grain));
}

void WorkerPool::ParallelFor(
    int64_t n, int64_t grain,
    absl::FunctionRef<void(int64_t begin, int64_t end)> fn) {
  DP_CHECK(n >= 0 && grain >= 1);
  if (n == 0) return;
  const int64_t grains = (n - 1) / grain + 1;  // no overflow near INT64_MAX
  const int shares = static_cast<int>(std::min<int64_t>(threads_, grains));
  if (shares == 1) {
    fn(0, n);
    return;
  }
  const Job job{&fn, n, grain, grains, shares};
  {
    absl::MutexLock lock(&mu_);
    DP_CHECK(!busy_);  // callers must serialise
    busy_ = true;
    job_ = job;
    unfinished_.store(shares - 1, std::memory_order_relaxed);
    ++generation_;
  }
  // The caller takes the last share: the pool's threads, which still have
  // to wake up, get the first ones.
  RunShare(job, shares - 1);

  const auto spin_until = std::chrono::steady_clock::now() + kSpinBeforeSleep;
  while (unfinished_.load(std::memory_order_acquire) != 0 &&
         std::chrono::steady_clock::now() < spin_until) {
    CpuRelax();
  }
  absl::MutexLock lock(&mu_);
  // Acquire: the shares' writes happen before the decrements seen here.
  mu_.Await(absl::Condition(
      +[](std::atomic<int>* pending) {
        return pending->load(std::memory_order_acquire) == 0;
      },
      &unfinished_));
  busy_ = false;
}

void WorkerPool::Work(int index) {
  uint64_t seen = 0;
  for (;;) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      auto woken = [this, &seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || generation_ != seen;
      };
      mu_.Await(absl::Condition(&woken));
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    // Threads beyond the shares of a small job have nothing to do.
    if (index >= job.shares - 1) continue;
    RunShare(job, index);
    // Under mu_ so that a caller already asleep in Await is woken.
    absl::MutexLock lock(&mu_);
    unfinished_.fetch_sub(1, std::memory_order_release);
  }
}

}  // namespace dp
