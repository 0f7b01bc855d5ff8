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
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
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

// Rank 0's page of a StepChannels whose handler keeps every request's
// answer for the test to give, mapped as its worker maps it.
class HeldAnswers {
 public:
  HeldAnswers()
      : channels_(
            [this](int, uint64_t, const ChannelRequest&,
                   StepChannels::Answer answer) {
              absl::MutexLock lock(&mu_);
              page_thread_ = static_cast<pid_t>(syscall(SYS_gettid));
              held_.push_back(std::move(answer));
            },
            ChannelSpin{}) {
    absl::StatusOr<int> fd = channels_.Open(0, 7);
    EXPECT_TRUE(fd.ok()) << fd.status();
    auto page = SharedRegion::Map(*fd, kStepChannelBytes, /*writable=*/true);
    EXPECT_TRUE(page.ok()) << page.status();
    page_ = *std::move(page);
  }
  SharedRegion* page() { return page_.get(); }
  const StepChannels& channels() const { return channels_; }

  // Waits until `n` requests were handed on; the answer of the n-th.
  StepChannels::Answer Handed(size_t n) {
    absl::MutexLock lock(&mu_);
    const Count count{&held_, n};
    mu_.Await(absl::Condition(&count, &Count::Enough));
    return held_[n - 1];
  }
  // The thread that handed the requests on (once one was).
  pid_t page_thread() {
    absl::MutexLock lock(&mu_);
    return page_thread_;
  }
  size_t handed() {
    absl::MutexLock lock(&mu_);
    return held_.size();
  }

 private:
  struct Count {
    const std::vector<StepChannels::Answer>* held;
    size_t n;
    bool Enough() const { return held->size() >= n; }
  };
  absl::Mutex mu_;
  std::vector<StepChannels::Answer> held_ ABSL_GUARDED_BY(mu_);
  pid_t page_thread_ ABSL_GUARDED_BY(mu_) = 0;
  StepChannels channels_;  // after what its handler uses: stopped first
  std::unique_ptr<SharedRegion> page_;
};

// A step's answer comes from another thread (the one that applied the
// update). The page's thread then already sleeps on the page for the next
// request: the answer must not wake it a second time per request, a
// hand-off that costs dp-ps's cores a switch per rank per step.
TEST(StepChannelsTest, APageThreadSleepsOncePerRequest) {
  HeldAnswers page;
  ChannelClient client(page.page());
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
    StepChannels::Answer answer = page.Handed(i + 1);
    if (tid == 0) {
      tid = page.page_thread();
      before = VoluntarySwitches(tid);
    }
    AwaitAsleep(tid);
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
  HeldAnswers page;
  ChannelClient client(page.page());
  ChannelRequest request;
  request.step = 1;
  EXPECT_EQ(client.Call(request, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);  // posted, not answered
  StepChannels::Answer first = page.Handed(1);
  // The request word moves again without a look at the answer (the page's
  // first word), and dp-ps is woken.
  auto* word = reinterpret_cast<std::atomic<uint32_t>*>(page.page()->data());
  word->fetch_add(1);
  syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
  while (page.channels().served() < 2) std::this_thread::yield();
  AwaitAsleep(page.page_thread());  // read, and waiting for the first answer
  EXPECT_EQ(page.handed(), 1u) << "two requests of one page in dp-ps";
  ChannelResponse response;
  response.step = 2;
  first(response);
  // The client's retry of its request meets the answer to it.
  absl::StatusOr<ChannelResponse> got = client.Call(request, absl::Minutes(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->step, 2);
  page.Handed(2);  // and only now the second request
}

}  // namespace
}  // namespace dp
