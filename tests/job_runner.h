// Real dp-ps and dp-worker processes on loopback for whole-job tests.
#ifndef DP_TESTS_JOB_RUNNER_H_
#define DP_TESTS_JOB_RUNNER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "tests/subprocess.h"

namespace dp {

inline const absl::Duration kJobTimeout = absl::Minutes(5);

// Starts dp-ps on loopback. port 0 picks a free one; *port receives the port
// it listens on once it does (0 if it never did).
std::unique_ptr<Subprocess> StartServer(std::vector<std::string> args,
                                        int* port, int fixed_port = 0);
std::unique_ptr<Subprocess> StartWorker(int port, int rank,
                                        std::vector<std::string> args = {});

struct JobResult {
  int ps_exit = -1;
  std::vector<int> worker_exits;
  std::string ps_output;
};
// dp-ps with `ps_args` plus --workers, and that many dp-workers; waits for
// all of them to exit.
JobResult RunJob(std::vector<std::string> ps_args, int workers,
                 std::vector<std::string> worker_args = {});

// The step dp-ps at `port` is at, via GetStatus; -1 when it does not answer.
int64_t CurrentStep(int port);
// Polls GetStatus until the step is >= `step`; false at the deadline.
bool WaitForStep(int port, int64_t step, absl::Duration timeout);

}  // namespace dp

#endif  // DP_TESTS_JOB_RUNNER_H_
