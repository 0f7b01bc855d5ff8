// A dp-ps restarted with another plan (--max_steps or --epochs, the
// documented way to extend or cut short a job) is followed by its workers
// at their next join: they neither stop early nor run past the new end.
#include <signal.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/flags.h"
#include "gtest/gtest.h"
#include "tests/job_runner.h"

namespace dp {
namespace {

// Stops both workers (SIGSTOP) at step >= 30 of a `planned`-step job, kills
// dp-ps, restarts it from its checkpoint (every 10 steps) with --max_steps
// new_end(the step they stopped at), lets the workers go on (SIGCONT), and
// checks that dp-ps and both workers finish there.
void RestartWithMaxSteps(int64_t planned,
                         const std::function<int64_t(int64_t)>& new_end) {
  TempDir dir;
  std::vector<std::string> flags = {"--workers=2", "--batch_size=16",
                                    "--seed=4", "--checkpoint_every=10",
                                    "--checkpoint_dir=" + dir.File("ckpt")};
  int port = 0;
  flags.push_back(absl::StrCat("--max_steps=", planned));
  auto ps = StartServer(flags, &port);
  auto w0 = StartWorker(port, 0);
  auto w1 = StartWorker(port, 1);
  ASSERT_TRUE(WaitForStep(port, 30, absl::Minutes(2)));
  w0->Signal(SIGSTOP);
  w1->Signal(SIGSTOP);
  // A push on its way may still count: one step more at most.
  const int64_t stopped = CurrentStep(port) + 1;
  ASSERT_LT(stopped, planned) << "the job ended before the stop";
  const int64_t new_max = new_end(stopped);
  ps->Signal(SIGKILL);
  EXPECT_EQ(ps->Wait(absl::Seconds(30)), 128 + SIGKILL);
  flags.back() = absl::StrCat("--max_steps=", new_max);
  int again = 0;
  ps = StartServer(flags, &again, port);
  ASSERT_EQ(again, port) << ps->output();
  w0->Signal(SIGCONT);
  w1->Signal(SIGCONT);
  // Before workers re-joined with the new plan, they stopped at the old end
  // (dp-ps then waited for pushes forever) or re-synced past the new one
  // until they gave up.
  const absl::Duration timeout = absl::Minutes(2);
  const std::string finished = absl::StrCat("finished at step ", new_max);
  EXPECT_EQ(w0->Wait(timeout), 0) << w0->output();
  EXPECT_EQ(w1->Wait(timeout), 0) << w1->output();
  EXPECT_EQ(ps->Wait(timeout), 0) << ps->output();
  EXPECT_NE(ps->output().find(absl::StrCat("done: ", new_max, " steps")),
            std::string::npos)
      << ps->output();
  EXPECT_NE(w0->output().find(finished), std::string::npos) << w0->output();
  EXPECT_NE(w1->output().find(finished), std::string::npos) << w1->output();
}

TEST(ReplanTest, WorkersFollowAServerRestartedWithMoreSteps) {
  RestartWithMaxSteps(1000, [](int64_t) { return 1200; });
}

// The new end counted from where the job stopped, so that it is ahead of
// the workers however fast they ran before the stop.
TEST(ReplanTest, WorkersFollowAServerRestartedWithFewerSteps) {
  RestartWithMaxSteps(1000, [](int64_t stopped) { return stopped + 100; });
}

}  // namespace
}  // namespace dp
