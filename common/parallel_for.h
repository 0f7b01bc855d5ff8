// A fixed set of threads for data-parallel loops over a range, such as the
// server's Adam update. The threads stay alive between calls: starting them
// per call would cost tens of microseconds of a 0.15 ms update.
#ifndef DP_COMMON_PARALLEL_FOR_H_
#define DP_COMMON_PARALLEL_FOR_H_

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace dp {

// Runs loops on `threads` threads: threads - 1 of its own plus the caller,
// which does its share instead of waiting idle. Idle threads sleep on a
// mutex condition, so a pool costs no CPU between calls - the machine's
// cores belong to the training workers then.
//
// Thread safety: one ParallelFor at a time; callers serialise (the server
// runs its update under its own lock). A second concurrent call aborts.
class WorkerPool {
 public:
  // threads <= 1: no threads are started and ParallelFor runs inline.
  explicit WorkerPool(int threads);
  // Joins the threads; no ParallelFor may be running.
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int threads() const { return threads_; }

  // Calls fn(begin, end) on disjoint, contiguous ranges that cover [0, n)
  // exactly once, one range per thread at most, and returns when all calls
  // have returned. Every boundary but n is a multiple of grain (>= 1) and
  // ranges are never empty; the grains are shared out as evenly as they
  // divide, in order: the first range starts at 0. With fewer grains than
  // threads, some threads get none; with one, fn runs inline.
  // fn's writes are visible to the caller when ParallelFor returns.
  void ParallelFor(int64_t n, int64_t grain,
                   absl::FunctionRef<void(int64_t begin, int64_t end)> fn);

 private:
  struct Job {
    const absl::FunctionRef<void(int64_t, int64_t)>* fn = nullptr;
    int64_t n = 0;
    int64_t grain = 1;
    int64_t grains = 0;
    int shares = 0;
  };

  // Runs share `index` of `shares` of the job.
  static void RunShare(const Job& job, int index);
  void Work(int index);

  const int threads_;
  absl::Mutex mu_;
  Job job_ ABSL_GUARDED_BY(mu_);
  // Bumped once per ParallelFor: a thread works when it sees a new value.
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Shares still running on the pool's threads. Changed under mu_, but
  // atomic so that the caller can poll it briefly without the lock before it
  // sleeps (see ParallelFor).
  std::atomic<int> unfinished_{0};
  std::vector<std::thread> workers_;
};

}  // namespace dp

#endif  // DP_COMMON_PARALLEL_FOR_H_
