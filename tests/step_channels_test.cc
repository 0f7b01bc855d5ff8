// dp-ps's end of the step channels: a request read from a page and not yet
// answered is waited for before dp-ps stops serving (the telling of a
// failure is written just after the coordinator counts it), a wait that no
// answer ends gives up at its deadline, and a page's thread sleeps once per
// request, not once more for each answer.
#include "server/step_channels.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace dp {
namespace {

// A line of /proc/self/task/<tid>/<file>: its field `index` (0-based,
// split at spaces).
std::string TaskField(pid_t tid, const std::string& file, int index) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/" + file);
  std::stringstream all;
  all << in.rdbuf();
  std::istringstream words(all.str());
  std::string word;
  for (int i = 0; i <= index && (words >> word); ++i) {
  }
  return word;
}

// Waits until thread `tid` sleeps (state S: parked on a futex or mutex).
void AwaitAsleep(pid_t tid) {
  // stat: "pid (comm) state ..." - comm is this test's thread name, one word.
  while (TaskField(tid, "stat", 2) != "S") std::this_thread::yield();
}

int64_t VoluntarySwitches(pid_t tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    const std::string key = "voluntary_ctxt_switches:";
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(key.size()));
  }
  return -1;
}

TEST(StepChannelsTest, AwaitAnsweredWaitsForTheAnswerOfARequestRead) {
  absl::Mutex mu;
  StepChannels::Answer held;  // the answer the handler has not given yet
  absl::Notification read;
  StepChannels channels(
      [&](int, uint64_t, const ChannelRequest&, StepChannels::Answer answer) {
        absl::MutexLock lock(&mu);
        held = std::move(answer);
        read.Notify();
      },
      ChannelSpin{});
  absl::StatusOr<int> fd = channels.Open(0, 7);
  ASSERT_TRUE(fd.ok()) << fd.status();
  auto page = SharedRegion::Map(*fd, kStepChannelBytes, /*writable=*/true);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_TRUE(channels.AwaitAnswered(absl::ZeroDuration()));  // none read

  ChannelClient client(page->get());
  absl::StatusOr<ChannelResponse> got;
  std::thread worker([&] {
    ChannelRequest request;
    request.step = 3;
    got = client.Call(request, absl::Minutes(5));
  });
  read.WaitForNotification();
  EXPECT_FALSE(channels.AwaitAnswered(absl::Milliseconds(1)));

  std::thread answering([&] {
    absl::MutexLock lock(&mu);
    ChannelResponse failed;
    failed.code = absl::StatusCode::kFailedPrecondition;
    failed.message = "the job failed: test";
    held(failed);
  });
  EXPECT_TRUE(channels.AwaitAnswered(absl::Minutes(5)));
  // What was answered before the stop is what the worker reads.
  channels.StopAll();
  answering.join();
  worker.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->code, absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(got->message, "the job failed: test");
}

// A step's answer comes from another thread (the one that applied the
// update). The page's thread then already sleeps on the page for the next
// request: the answer must not wake it a second time per request, a
// hand-off that costs dp-ps's cores a switch per rank per step.
TEST(StepChannelsTest, APageThreadSleepsOncePerRequest) {
  absl::Mutex mu;
  StepChannels::Answer held;  // under mu
  pid_t page_thread = 0;      // under mu
  StepChannels channels(
      [&](int, uint64_t, const ChannelRequest&, StepChannels::Answer answer) {
        absl::MutexLock lock(&mu);
        page_thread = static_cast<pid_t>(syscall(SYS_gettid));
        held = std::move(answer);
      },
      ChannelSpin{});
  absl::StatusOr<int> fd = channels.Open(0, 7);
  ASSERT_TRUE(fd.ok()) << fd.status();
  auto page = SharedRegion::Map(*fd, kStepChannelBytes, /*writable=*/true);
  ASSERT_TRUE(page.ok()) << page.status();
  ChannelClient client(page->get());

  constexpr int kRequests = 100;
  int64_t before = 0;
  pid_t tid = 0;
  for (int i = 0; i < kRequests; ++i) {
    // Each request meets the page's thread asleep, and its answer is given
    // once the thread has gone to sleep again after handing it on: every
    // sleep it can take is taken.
    if (tid != 0) AwaitAsleep(tid);
    absl::StatusOr<ChannelResponse> got;
    std::thread worker([&] {
      ChannelRequest request;
      request.step = i;
      got = client.Call(request, absl::Minutes(5));
    });
    {
      absl::MutexLock lock(&mu);
      mu.Await(absl::Condition(
          +[](StepChannels::Answer* a) { return static_cast<bool>(*a); },
          &held));
      if (tid == 0) {
        tid = page_thread;
        before = VoluntarySwitches(tid);
      }
    }
    AwaitAsleep(tid);
    StepChannels::Answer answer;
    {
      absl::MutexLock lock(&mu);
      answer = std::exchange(held, nullptr);
    }
    ChannelResponse response;
    response.step = i + 1;
    answer(response);
    worker.join();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->step, i + 1);
  }
  AwaitAsleep(tid);
  const int64_t sleeps = VoluntarySwitches(tid) - before;
  // The first request's sleeps were counted from inside its handler: the
  // remaining 99 requests, one sleep each (a sleep awaiting an answer would
  // make it 2 each).
  EXPECT_LT(sleeps, kRequests * 3 / 2) << "sleeps of the page thread";
  EXPECT_GE(sleeps, kRequests - 1);
}

// A worker that posts its next request before reading the answer to the
// last (only a broken or hostile one does) has it handed on only once the
// last is answered, and that answer still reaches the wait for the last:
// dp-ps never holds two requests of one page.
TEST(StepChannelsTest, ARequestPostedBeforeTheLastAnswerWaitsForIt) {
  absl::Mutex mu;
  std::vector<StepChannels::Answer> held;  // under mu
  pid_t page_thread = 0;                   // under mu
  StepChannels channels(
      [&](int, uint64_t, const ChannelRequest&, StepChannels::Answer answer) {
        absl::MutexLock lock(&mu);
        page_thread = static_cast<pid_t>(syscall(SYS_gettid));
        held.push_back(std::move(answer));
      },
      ChannelSpin{});
  absl::StatusOr<int> fd = channels.Open(0, 7);
  ASSERT_TRUE(fd.ok()) << fd.status();
  auto page = SharedRegion::Map(*fd, kStepChannelBytes, /*writable=*/true);
  ASSERT_TRUE(page.ok()) << page.status();
  ChannelClient client(page->get());
  ChannelRequest request;
  request.step = 1;
  EXPECT_EQ(client.Call(request, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);  // posted, not answered
  // Waits until the handler has had `n` requests.
  struct Handed {
    const std::vector<StepChannels::Answer>* held;
    size_t n;
    bool Enough() const { return held->size() >= n; }
  };
  auto handed = [&](size_t n) {
    absl::MutexLock lock(&mu);
    const Handed h{&held, n};
    mu.Await(absl::Condition(&h, &Handed::Enough));
  };
  handed(1);
  // The request word moves again without a look at the answer (the page's
  // first word), and dp-ps is woken.
  auto* word = reinterpret_cast<std::atomic<uint32_t>*>((*page)->data());
  word->fetch_add(1);
  syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
  while (channels.served() < 2) std::this_thread::yield();
  pid_t tid = 0;
  {
    absl::MutexLock lock(&mu);
    tid = page_thread;
  }
  AwaitAsleep(tid);  // read, and waiting for the first answer
  {
    absl::MutexLock lock(&mu);
    EXPECT_EQ(held.size(), 1u) << "two requests of one page in dp-ps";
  }
  StepChannels::Answer first;
  {
    absl::MutexLock lock(&mu);
    first = held[0];
  }
  ChannelResponse response;
  response.step = 2;
  first(response);
  // The client's retry of its request meets the answer to it.
  absl::StatusOr<ChannelResponse> got = client.Call(request, absl::Minutes(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->step, 2);
  handed(2);  // and only now the second request
}

}  // namespace
}  // namespace dp
