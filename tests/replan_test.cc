// A dp-ps restarted with another plan (--max_steps or --epochs, the
// documented way to extend or cut short a job) is followed by its workers
// at their next join: they neither stop early nor run past the new end.
#include <signal.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/flags.h"
#include "gtest/gtest.h"
#include "tests/job_runner.h"

namespace dp {
namespace {

// Stops both workers (SIGSTOP) at step >= 30 of a 1000-step job, kills
// dp-ps, restarts it from its checkpoint (every 10 steps) with
// --max_steps=new_max, lets the workers go on (SIGCONT), and checks that
// dp-ps and both workers finish at new_max.
void RestartWithMaxSteps(int64_t new_max) {
  TempDir dir;
  std::vector<std::string> flags = {"--workers=2", "--batch_size=16",
                                    "--seed=4", "--checkpoint_every=10",
                                    "--checkpoint_dir=" + dir.File("ckpt")};
  int port = 0;
  flags.push_back("--max_steps=1000");
  auto ps = StartServer(flags, &port);
  auto w0 = StartWorker(port, 0);
  auto w1 = StartWorker(port, 1);
  ASSERT_TRUE(WaitForStep(port, 30, absl::Minutes(2)));
  w0->Signal(SIGSTOP);
  w1->Signal(SIGSTOP);
  ps->Signal(SIGKILL);
  EXPECT_EQ(ps->Wait(absl::Seconds(30)), 128 + SIGKILL);
  flags.back() = absl::StrCat("--max_steps=", new_max);
  int again = 0;
  ps = StartServer(flags, &again, port);
  ASSERT_EQ(again, port) << ps->output();
  w0->Signal(SIGCONT);
  w1->Signal(SIGCONT);
  // Before workers re-joined with the new plan, they stopped at 1000 (dp-ps
  // then waited for pushes forever) or re-synced past 200 until they gave
  // up.
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
  RestartWithMaxSteps(1200);
}

TEST(ReplanTest, WorkersFollowAServerRestartedWithFewerSteps) {
  RestartWithMaxSteps(200);
}

}  // namespace
}  // namespace dp
