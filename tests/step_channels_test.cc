// dp-ps's end of the step channels: a request read from a page and not yet
// answered is waited for before dp-ps stops serving (the telling of a
// failure is written just after the coordinator counts it), and a wait that
// no answer ends gives up at its deadline.
#include "server/step_channels.h"

#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace dp {
namespace {

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

}  // namespace
}  // namespace dp
