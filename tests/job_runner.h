// Real dp-ps and dp-worker processes on loopback for whole-job tests.
#ifndef DP_TESTS_JOB_RUNNER_H_
#define DP_TESTS_JOB_RUNNER_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "proto/dp.pb.h"
#include "tests/subprocess.h"

namespace dp {

inline const absl::Duration kJobTimeout = absl::Minutes(5);

// Starts dp-ps on loopback. port 0 picks a free one; *port receives the port
// it listens on once it does (0 if it never did).
std::unique_ptr<Subprocess> StartServer(std::vector<std::string> args,
                                        int* port, int fixed_port = 0);
std::unique_ptr<Subprocess> StartWorker(int port, int rank,
                                        std::vector<std::string> args = {});
// A worker of the dp-ps (shards) at `ps` ("127.0.0.1:p0,127.0.0.1:p1").
std::unique_ptr<Subprocess> StartWorker(const std::string& ps, int rank,
                                        std::vector<std::string> args = {});

// A sharded dp-ps on loopback: `args` plus the flags that make a process
// shard `shard` of `ports.size()`; shard 0 is told the others' ports.
std::vector<std::string> ShardArgs(std::vector<std::string> args, int shard,
                                   const std::vector<int>& ports);
// Starts `shards` shards of a job: 1..S-1 first on free ports, then shard
// 0, told their addresses. *ports receives every shard's port.
std::vector<std::unique_ptr<Subprocess>> StartShards(
    int shards, const std::vector<std::string>& args, std::vector<int>* ports);
// "127.0.0.1:p0,127.0.0.1:p1,...": what workers get as --ps.
std::string PsList(const std::vector<int>& ports);

// A job's `count` dp-ps shards (1: one plain dp-ps), each with `args` and a
// checkpoint directory of its own in `dir` (ckpt0, ckpt1...), for tests
// that kill them -9 and restart them where they were.
class RestartableShards {
 public:
  RestartableShards(int count, std::vector<std::string> args,
                    const TempDir& dir);
  // Kills shard k -9 and starts it again on its port (it resumes from its
  // newest checkpoint); false, with a test failure, if it did not listen
  // there.
  bool KillAndRestart(int k);
  int port(int k) const { return ports_[k]; }
  std::string list() const { return PsList(ports_); }
  // Every shard's exit code, expected 0, failing the test otherwise.
  void ExpectAllExitZero();

 private:
  void Start(int k, int port);

  std::vector<std::vector<std::string>> args_;
  std::vector<int> ports_;
  std::vector<std::unique_ptr<Subprocess>> ps_;
};

struct JobResult {
  int ps_exit = -1;  // the largest exit code of the shards
  std::vector<int> worker_exits;
  std::string ps_output;  // of shard 0
};
// dp-ps with `ps_args` plus --workers (as `shards` shards), and that many
// dp-workers; waits for all of them to exit.
JobResult RunJob(std::vector<std::string> ps_args, int workers,
                 std::vector<std::string> worker_args = {}, int shards = 1);

// Polls `done` every 5 ms until it holds (true) or `timeout` passes
// (false): for state only visible from outside, such as a /metrics answer.
bool PollUntil(const std::function<bool()>& done, absl::Duration timeout);

// dp-ps's GetStatus at `port`; nullopt when it does not answer.
std::optional<dp::v1::GetStatusResponse> StatusAt(int port);
// The step dp-ps at `port` is at, via GetStatus; -1 when it does not answer.
int64_t CurrentStep(int port);
// Polls GetStatus until the step is >= `step`; false at the deadline.
bool WaitForStep(int port, int64_t step, absl::Duration timeout);
// The ranks dp-ps at `port` has registered (GetStatus); empty when it does
// not answer.
std::vector<int> RegisteredRanks(int port);
// Polls GetStatus until every rank of `ranks` is registered; false at the
// deadline.
bool WaitForRegistered(int port, const std::vector<int>& ranks,
                       absl::Duration timeout);
// Polls GetStatus until `holds` is true of one answer, which it returns;
// nullopt at the deadline.
std::optional<dp::v1::GetStatusResponse> WaitForStatus(
    int port,
    const std::function<bool(const dp::v1::GetStatusResponse&)>& holds,
    absl::Duration timeout);
// The bytes of the model file at `path` (empty, failing the test, when it
// cannot be read).
std::string ReadModel(const std::string& path);
// The saved model (its bytes) of the job RunJob(ps_args + --save_model,
// workers) runs, without failures: the reference a fault test compares its
// model with. Several tests (each its own process under ctest) share one
// reference, so it is kept in TMPDIR under a name that hashes the flags and
// both binaries, and computed only when no such file is there yet.
std::string ReferenceModel(const std::vector<std::string>& ps_args,
                           int workers);
// Polls until `path` exists; false at the deadline. dp-ps writes checkpoints
// in the background and renames them into place, so a checkpoint's name
// appears only once it is whole.
bool WaitForFile(const std::string& path, absl::Duration timeout);

}  // namespace dp

#endif  // DP_TESTS_JOB_RUNNER_H_
