// The step channel's two ends over one page, in two threads: what one posts
// the other reads once and answers; a retried request is the same request;
// a closed page ends every wait with its status; a worker that wakes dp-ps
// without posting, or rewrites its request after posting it, changes what
// dp-ps decided on not at all.
#include "common/step_channel.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstring>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace dp {
namespace {

std::unique_ptr<SharedRegion> NewPage() {
  auto page = SharedRegion::Create("test step channel", kStepChannelBytes);
  EXPECT_TRUE(page.ok()) << page.status();
  return *std::move(page);
}

ChannelRequest Request(int64_t step) {
  ChannelRequest r;
  r.step = step;
  r.block_first = 2;
  r.block_count = 2;
  r.loss = 0.625f;
  r.num_samples = 64;
  r.encoding = 1;
  return r;
}

TEST(StepChannelTest, ARequestArrivesAsPostedAndItsAnswerComesBack) {
  auto page = NewPage();
  ChannelClient client(page.get());
  ChannelServer server(page.get());
  std::thread dp_ps([&] {
    ChannelRequest got;
    uint32_t seq = 0;
    ASSERT_TRUE(server.Next(&got, &seq));
    EXPECT_TRUE(got == Request(41));
    ChannelResponse answer;
    answer.step = 42;
    answer.block_first = 1;
    answer.block_count = 1;
    answer.done = true;
    server.Answer(seq, answer);
    ASSERT_TRUE(server.Next(&got, &seq));
    EXPECT_TRUE(got.idle);
    ChannelResponse refused;
    refused.code = absl::StatusCode::kAborted;
    refused.message = "step 42 was rolled back";
    server.Answer(seq, refused);
  });
  absl::StatusOr<ChannelResponse> a =
      client.Call(Request(41), absl::Seconds(60));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->code, absl::StatusCode::kOk);
  EXPECT_EQ(a->step, 42);
  EXPECT_EQ(a->block_first, 1);
  EXPECT_EQ(a->block_count, 1);
  EXPECT_TRUE(a->done);
  EXPECT_FALSE(a->work_only);
  ChannelRequest idle = Request(42);
  idle.idle = true;
  a = client.Call(idle, absl::Seconds(60));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->code, absl::StatusCode::kAborted);
  EXPECT_EQ(a->message, "step 42 was rolled back");
  dp_ps.join();
  EXPECT_EQ(server.served(), 2);
}

TEST(StepChannelTest, AWaitRetriedAfterItsDeadlineIsTheSameRequest) {
  auto page = NewPage();
  ChannelClient client(page.get());
  ChannelServer server(page.get());
  ChannelRequest got;
  uint32_t seq = 0;
  // No answer yet: the wait ends at its deadline, the request stays posted.
  EXPECT_EQ(client.Call(Request(7), absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(server.Next(&got, &seq));
  std::thread dp_ps([&] {
    ChannelResponse answer;
    answer.step = 8;
    server.Answer(seq, answer);
  });
  absl::StatusOr<ChannelResponse> a =
      client.Call(Request(7), absl::Seconds(60));
  dp_ps.join();
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->step, 8);
  EXPECT_EQ(server.served(), 1) << "the retry was posted as a second request";
}

TEST(StepChannelTest, AClosedPageEndsTheWaitInProgressAndEveryLaterOne) {
  auto page = NewPage();
  ChannelClient client(page.get());
  ChannelServer server(page.get());
  std::thread dp_ps([&] {
    ChannelRequest got;
    uint32_t seq = 0;
    ASSERT_TRUE(server.Next(&got, &seq));
    server.Close(absl::FailedPreconditionError("another process registered"));
    EXPECT_FALSE(server.Next(&got, &seq));
  });
  absl::StatusOr<ChannelResponse> a = client.Call(Request(3), absl::Hours(1));
  dp_ps.join();
  EXPECT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(a.status().message(), "another process registered");
  EXPECT_EQ(client.Call(Request(4), absl::Hours(1)).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(StepChannelTest, ClosingTheClientEndsItsWait) {
  auto page = NewPage();
  ChannelClient client(page.get());
  std::thread attendance_ended([&] {
    // Once the request is posted (dp-ps never answers it).
    while (reinterpret_cast<std::atomic<uint32_t>*>(page->data())->load() ==
           0) {
      std::this_thread::yield();
    }
    client.Close();
  });
  EXPECT_EQ(client.Call(Request(3), absl::Hours(1)).status().code(),
            absl::StatusCode::kUnavailable);
  attendance_ended.join();
}

TEST(StepChannelTest, StopEndsAParkedServer) {
  auto page = NewPage();
  ChannelServer server(page.get());
  std::thread dp_ps([&] {
    ChannelRequest got;
    uint32_t seq = 0;
    EXPECT_FALSE(server.Next(&got, &seq));
  });
  server.Stop();
  dp_ps.join();
}

// The request word is the page's first: a worker may wake dp-ps on it as
// often as it likes without posting, and rewrite a request after posting
// it. Once such wake-ups have run on for kIdleWakesBeforeBackoff, each
// costs dp-ps a backoff's sleep, and a request posted in the middle of the
// flood is still read.
TEST(StepChannelTest, WakesWithoutARequestAndRewritesAfterOneChangeNothing) {
  auto page = NewPage();
  auto* word = reinterpret_cast<uint32_t*>(page->data());
  ChannelServer server(page.get());
  std::atomic<bool> stop{false};
  std::thread waker([&] {
    while (!stop.load()) {
      syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
    }
  });
  absl::Notification read;
  ChannelRequest got;
  uint32_t seq = 0;
  std::thread dp_ps([&] {
    ASSERT_TRUE(server.Next(&got, &seq));
    read.Notify();
  });
  // However often it is woken, dp-ps reads no request until one is posted.
  while (server.idle_wakes() < 1000) std::this_thread::yield();
  EXPECT_FALSE(read.HasBeenNotified());
  ChannelClient client(page.get());
  EXPECT_EQ(client.Call(Request(5), absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  read.WaitForNotification();
  dp_ps.join();
  // Rewritten after dp-ps read it: dp-ps's copy is what was posted.
  std::memset(page->data() + 8, 0xff, 64 - 8);
  EXPECT_TRUE(got == Request(5));
  stop.store(true);
  waker.join();
  EXPECT_EQ(server.served(), 1);
  // Every idle wake-up after the first run of them was followed by a sleep.
  constexpr int kRun = ChannelSpin::kIdleWakesBeforeBackoff;
  EXPECT_GE(server.backoffs(), 1000 - kRun);
  EXPECT_LE(server.idle_wakes() - server.backoffs(), kRun);
}

double ThreadCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

// Burns `seconds` of this thread's CPU time: the other end's work.
void Work(double seconds) {
  const double start = ThreadCpuSeconds();
  while (ThreadCpuSeconds() - start < seconds) {
  }
}

// Both ends on one core, each spinning far longer than the test: only a
// spin that gives the core away lets the other end, on the same core, do
// the work it waits for. Counted in CPU time, not wall time: the waiting
// end spends less than half of what the working end burns, where a spin
// that held the core would get half of it, shared fairly.
TEST(StepChannelTest, ASpinningWaitGivesItsCoreToTheEndItWaitsFor) {
  cpu_set_t all;
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &all)) {
      CPU_SET(cpu, &one);
      break;
    }
  }
  // This thread, and the one started below, which inherits it.
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  constexpr double kWork = 0.2;
  ChannelSpin spin;
  spin.spin = absl::Hours(1);
  auto page = NewPage();
  ChannelClient client(page.get(), spin);
  ChannelServer server(page.get(), spin);
  double server_waited = 0;
  std::thread dp_ps([&] {
    ChannelRequest got;
    uint32_t seq = 0;
    const double start = ThreadCpuSeconds();
    ASSERT_TRUE(server.Next(&got, &seq));  // while the worker computes
    server_waited = ThreadCpuSeconds() - start;
    Work(kWork);  // the update
    server.Answer(seq, ChannelResponse{});
  });
  Work(kWork);  // the worker's compute
  const double start = ThreadCpuSeconds();
  absl::StatusOr<ChannelResponse> a = client.Call(Request(1), absl::Hours(1));
  const double client_waited = ThreadCpuSeconds() - start;
  dp_ps.join();
  ASSERT_EQ(sched_setaffinity(0, sizeof(all), &all), 0);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_LT(server_waited, kWork / 2) << "dp-ps spun " << server_waited;
  EXPECT_LT(client_waited, kWork / 2);
}

}  // namespace
}  // namespace dp
