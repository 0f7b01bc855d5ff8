// WorkerPool::ParallelFor: coverage, alignment and reuse.
#include "common/parallel_for.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace dp {
namespace {

struct Calls {
  absl::Mutex mu;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  std::set<std::thread::id> threads;
};

// Runs one ParallelFor that counts how often each index is visited and
// records every range and the thread it ran on.
std::vector<int> Visit(WorkerPool& pool, int64_t n, int64_t grain,
                       Calls* calls) {
  std::vector<std::atomic<int>> hits(n);
  pool.ParallelFor(n, grain, [&](int64_t begin, int64_t end) {
    {
      absl::MutexLock lock(&calls->mu);
      calls->ranges.emplace_back(begin, end);
      calls->threads.insert(std::this_thread::get_id());
    }
    for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
  });
  std::vector<int> counts;
  for (auto& h : hits) counts.push_back(h.load());
  return counts;
}

// Every index once, ranges non-empty, disjoint and aligned to the grain, at
// most one range per thread and no more ranges than grains.
void ExpectPartition(int threads, int64_t n, int64_t grain) {
  SCOPED_TRACE(testing::Message()
               << "threads " << threads << " n " << n << " grain " << grain);
  WorkerPool pool(threads);
  Calls calls;
  const std::vector<int> counts = Visit(pool, n, grain, &calls);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(counts[i], 1) << "index " << i;
  const int64_t grains = (n + grain - 1) / grain;
  EXPECT_LE(static_cast<int64_t>(calls.ranges.size()),
            std::min<int64_t>(std::max(threads, 1), grains));
  EXPECT_EQ(calls.threads.size(), calls.ranges.size());
  std::sort(calls.ranges.begin(), calls.ranges.end());
  int64_t next = 0;
  for (const auto& [begin, end] : calls.ranges) {
    EXPECT_EQ(begin, next);  // contiguous
    EXPECT_LT(begin, end);
    EXPECT_EQ(begin % grain, 0);
    if (end != n) EXPECT_EQ(end % grain, 0);
    next = end;
  }
  EXPECT_EQ(next, n);
}

TEST(WorkerPoolTest, CoversEveryIndexOnceInRangesAlignedToTheGrain) {
  for (int threads : {1, 2, 3, 4, 7}) {
    for (int64_t n : {1, 5, 511, 512, 513, 1024, 4097, 235146}) {
      for (int64_t grain : {1, 3, 512}) ExpectPartition(threads, n, grain);
    }
  }
}

TEST(WorkerPoolTest, SharesAreAsEvenAsTheGrainsAllow) {
  WorkerPool pool(3);
  Calls calls;
  Visit(pool, 10 * 512 + 7, 512, &calls);  // 11 grains: 3 + 4 + 4
  std::sort(calls.ranges.begin(), calls.ranges.end());
  const std::vector<std::pair<int64_t, int64_t>> expected = {
      {0, 3 * 512}, {3 * 512, 7 * 512}, {7 * 512, 10 * 512 + 7}};
  EXPECT_EQ(calls.ranges, expected);
  EXPECT_EQ(calls.threads.size(), 3u);
}

TEST(WorkerPoolTest, FewerGrainsThanThreadsUsesOneRangePerGrain) {
  WorkerPool pool(8);
  Calls calls;
  const std::vector<int> counts = Visit(pool, 3, 1, &calls);
  EXPECT_EQ(counts, std::vector<int>({1, 1, 1}));
  std::sort(calls.ranges.begin(), calls.ranges.end());
  const std::vector<std::pair<int64_t, int64_t>> expected = {
      {0, 1}, {1, 2}, {2, 3}};
  EXPECT_EQ(calls.ranges, expected);
}

TEST(WorkerPoolTest, OneGrainRunsInlineOnTheCaller) {
  WorkerPool pool(4);
  Calls calls;
  Visit(pool, 100, 512, &calls);
  ASSERT_EQ(calls.ranges.size(), 1u);
  EXPECT_EQ(calls.ranges[0], std::make_pair(int64_t{0}, int64_t{100}));
  EXPECT_EQ(*calls.threads.begin(), std::this_thread::get_id());
}

TEST(WorkerPoolTest, EmptyRangeCallsNothing) {
  WorkerPool pool(3);
  int calls = 0;
  pool.ParallelFor(0, 512, [&](int64_t, int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST(WorkerPoolTest, OneThreadRunsTheWholeRangeInline) {
  for (int threads : {-1, 0, 1}) {
    WorkerPool pool(threads);
    EXPECT_EQ(pool.threads(), 1);
    Calls calls;
    Visit(pool, 10000, 512, &calls);
    ASSERT_EQ(calls.ranges.size(), 1u);
    EXPECT_EQ(calls.ranges[0], std::make_pair(int64_t{0}, int64_t{10000}));
    EXPECT_EQ(*calls.threads.begin(), std::this_thread::get_id());
  }
}

// The threads are reused: many calls in a row, of changing sizes (so that
// threads without a share in one call get one in the next), each complete
// when ParallelFor returns - plain (non-atomic) writes included.
TEST(WorkerPoolTest, RepeatedCallsEachFinishBeforeReturning) {
  WorkerPool pool(4);
  std::vector<int64_t> data(4096);
  for (int call = 0; call < 2000; ++call) {
    const int64_t n = 1 + call % 4096 * 7 % 4096;
    pool.ParallelFor(n, 64, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) data[i] = call;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(data[i], call) << "call " << call;
  }
}

// Whatever the pool's threads run may take longer than the caller's share.
TEST(WorkerPoolTest, WaitsForSlowShares) {
  WorkerPool pool(2);
  std::atomic<int> done{0};
  const std::thread::id caller = std::this_thread::get_id();
  pool.ParallelFor(2, 1, [&](int64_t, int64_t) {
    if (std::this_thread::get_id() != caller) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    done.fetch_add(1);
  });
  EXPECT_EQ(done.load(), 2);
}

}  // namespace
}  // namespace dp
