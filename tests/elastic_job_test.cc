// Elastic jobs with real processes and real signals: the model depends on
// the global batch and the micro-batch only - not on how many workers
// computed it, nor on workers killed, joining, or stopped mid-job.
#include <signal.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "tests/job_runner.h"

namespace dp {
namespace {

constexpr int kSteps = 240;

// 4 micro-batches of 32 a step (or `micro_batches`).
std::vector<std::string> Flags(const std::string& model, int steps = kSteps,
                               int micro_batches = 4) {
  return {absl::StrCat("--global_batch=", 32 * micro_batches),
          "--micro_batch=32", absl::StrCat("--max_steps=", steps), "--seed=11",
          "--save_model=" + model};
}

std::string ModelOf(const TempDir& dir, int workers, int shards = 1,
                    int steps = kSteps, int micro_batches = 4) {
  const std::string path = dir.File(absl::StrCat(
      "model-", workers, "-", shards, "-", micro_batches, ".safetensors"));
  JobResult r = RunJob(Flags(path, steps, micro_batches), workers, {}, shards);
  EXPECT_EQ(r.ps_exit, 0) << r.ps_output;
  return ReadModel(path);
}

TEST(ElasticJobTest, OneTwoThreeAndFourWorkersGiveOneModel) {
  TempDir dir;
  const std::string four = ModelOf(dir, 4);
  ASSERT_FALSE(four.empty());
  EXPECT_TRUE(ModelOf(dir, 1) == four) << "1 worker";
  EXPECT_TRUE(ModelOf(dir, 2) == four) << "2 workers";
  EXPECT_TRUE(ModelOf(dir, 3) == four) << "3 workers";
  EXPECT_TRUE(ModelOf(dir, 2, /*shards=*/2) == four) << "2 workers, 2 shards";
}

// AdamW with warm-up, cosine decay and clipping (at 0.05, well below
// SimpleNet's gradient norms early in training): the global norm is one
// sum in a fixed order
// on dp-ps, so the model is still the same, byte for byte, on one worker
// and one update thread as on two workers and three threads. Each setting
// must also change the model - else the comparison proves nothing.
TEST(ElasticJobTest, AdamWScheduleAndClippingGiveOneModelOnAnyNumberOfWorkers) {
  constexpr int kFew = 40;
  TempDir dir;
  const std::vector<std::string> optimiser = {
      "--optimizer=adamw",    "--weight_decay=0.05", "--lr=3e-3",
      "--lr_schedule=cosine", "--warmup_steps=8",    "--lr_min=1e-4",
      "--clip_grad_norm=0.05"};
  auto model = [&](const std::string& name, int workers,
                   std::vector<std::string> extra) {
    const std::string path = dir.File(name + ".safetensors");
    std::vector<std::string> flags = Flags(path, kFew);
    flags.insert(flags.end(), extra.begin(), extra.end());
    JobResult r = RunJob(flags, workers);
    EXPECT_EQ(r.ps_exit, 0) << r.ps_output;
    return ReadModel(path);
  };
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> flags = optimiser;
    flags.insert(flags.end(), extra.begin(), extra.end());
    return flags;
  };
  const std::string one = model("one", 1, with({"--update_threads=1"}));
  ASSERT_FALSE(one.empty());
  EXPECT_TRUE(model("two", 2, with({"--update_threads=3"})) == one)
      << "2 workers, 3 update threads";
  EXPECT_FALSE(model("unclipped", 2, with({"--clip_grad_norm=0"})) == one)
      << "clipping changed nothing";
  EXPECT_FALSE(model("adam", 2,
                     {"--lr=3e-3", "--lr_schedule=cosine", "--warmup_steps=8",
                      "--lr_min=1e-4", "--clip_grad_norm=0.05"}) == one)
      << "AdamW's decay changed nothing";
}

// An odd number of micro-batches a step: a worker's block is then summed
// in a tree whose mirror image differs (3: (g0 + g1) + g2; 5: ((g0 + g1) +
// g2) + (g3 + g4)), where with 4 every plan's blocks are pairs or leaves,
// summed alike either way round. K workers leave the whole tree to dp-ps;
// fewer have a worker sum blocks of 3 (and 2). A few steps show it.
TEST(ElasticJobTest, OddMicroBatchCountsGiveOneModelOnAnyNumberOfWorkers) {
  constexpr int kFew = 8;
  TempDir dir;
  for (const int k : {3, 5}) {
    const std::string all_apart = ModelOf(dir, k, 1, kFew, k);
    ASSERT_FALSE(all_apart.empty());
    EXPECT_TRUE(ModelOf(dir, 1, 1, kFew, k) == all_apart)
        << "K " << k << ", 1 worker";
    EXPECT_TRUE(ModelOf(dir, 2, 1, kFew, k) == all_apart)
        << "K " << k << ", 2 workers";
  }
}

// The jobs whose workers leave and join: long enough for new workers to
// load their data and join, up to 4 workers. A killed worker's connection
// closes, which counts it missing at once: the lease only bounds a silent
// one, and is far above a healthy worker's silence on a loaded machine.
constexpr int kLong = 1500;
std::vector<std::string> ElasticFlags(const std::string& model) {
  std::vector<std::string> flags = Flags(model, kLong);
  flags.push_back("--workers=4");
  flags.push_back("--worker_timeout_s=600");
  return flags;
}

// Stops (SIGSTOP) or continues (SIGCONT) the workers of `w` that run, so
// that the job holds still while a test acts: with a long lease a stopped
// worker is not lost, and its step waits for it.
void Hold(std::vector<std::unique_ptr<Subprocess>>& w, int sig) {
  for (auto& p : w) {
    if (p != nullptr && !p->Wait(absl::ZeroDuration()).has_value()) {
      p->Signal(sig);
    }
  }
}

// 4 workers; two are killed (-9, no replacement), the job goes on with 2;
// then two new workers without a rank join: the model of 4 throughout.
void LeaveAndJoin(int shards) {
  TempDir dir;
  const std::string reference = ModelOf(dir, 4, 1, kLong);
  const std::string model = dir.File("model.safetensors");
  const std::vector<std::string> flags = ElasticFlags(model);
  std::vector<int> ports;
  auto ps = StartShards(shards, flags, &ports);
  const int port = ports[0];
  const std::string list = PsList(ports);
  std::vector<std::unique_ptr<Subprocess>> w;
  for (int r = 0; r < 4; ++r) w.push_back(StartWorker(list, r));
  ASSERT_TRUE(WaitForStep(port, 30, absl::Minutes(2)));
  w[3]->Signal(SIGKILL);
  EXPECT_EQ(w[3]->Wait(absl::Seconds(30)), 128 + SIGKILL);
  const int64_t three = CurrentStep(port);
  ASSERT_TRUE(WaitForStep(port, three + 30, absl::Minutes(2)))
      << "3 workers go on";
  w[2]->Signal(SIGKILL);
  EXPECT_EQ(w[2]->Wait(absl::Seconds(30)), 128 + SIGKILL);
  const int64_t two = CurrentStep(port);
  ASSERT_TRUE(WaitForStep(port, two + 30, absl::Minutes(2)))
      << "2 workers go on";
  // Their ranks are free once they are lost (a joiner stands by until then).
  EXPECT_TRUE(ps[0]->WaitForOutput("rank 2 is missing", absl::Seconds(60)));
  // The job held while the new workers register, so that they join mid-job
  // however fast it runs. (Their join itself waits for a step, which the
  // hold may keep from coming.)
  Hold(w, SIGSTOP);
  ASSERT_LT(CurrentStep(port), kLong - 500) << "too fast to see the joins";
  w[2] = StartWorker(list, -1);
  w[3] = StartWorker(list, -1);
  // Registered: dp-ps gave them a rank and the job ("tensors through ...").
  for (int r : {2, 3}) {
    ASSERT_TRUE(w[r]->WaitForOutput(": tensors through ", absl::Minutes(2)))
        << w[r]->output();
  }
  Hold(w, SIGCONT);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(w[r]->Wait(kJobTimeout), 0) << w[r]->output();
  }
  for (auto& p : ps) EXPECT_EQ(p->Wait(kJobTimeout), 0) << p->output();
  EXPECT_TRUE(ReadModel(model) == reference);
  // The new workers took the lost ranks and worked.
  EXPECT_NE(w[2]->output().find("joined at step"), std::string::npos);
  EXPECT_EQ(w[2]->output().find(" 0 steps here"), std::string::npos)
      << w[2]->output();
}

TEST(ElasticJobTest, WorkersKilledAndNewOnesJoiningGiveTheSameModel) {
  LeaveAndJoin(1);
}

TEST(ElasticJobTest, ShardedWorkersKilledAndJoiningGiveTheSameModel) {
  LeaveAndJoin(2);
}

// A killed worker's connection closes: its block goes to the other worker
// at once, though its lease (10 minutes) is far from running out and no
// straggler backup would step in. The model is the same.
void AKilledWorkerIsMissedAtOnce(int shards) {
  TempDir dir;
  const std::string reference = ModelOf(dir, 2, 1, kLong);
  const std::string model = dir.File("model.safetensors");
  std::vector<std::string> flags = Flags(model, kLong);
  flags.push_back("--workers=2");
  flags.push_back("--worker_timeout_s=600");
  flags.push_back("--backup_blocks=0");
  std::vector<int> ports;
  auto ps = StartShards(shards, flags, &ports);
  const int port = ports[0];
  const std::string list = PsList(ports);
  std::vector<std::unique_ptr<Subprocess>> w;
  for (int r = 0; r < 2; ++r) w.push_back(StartWorker(list, r));
  ASSERT_TRUE(WaitForStep(port, 30, absl::Minutes(2)));
  // Rank 0 held while rank 1 is killed: the job cannot run out before the
  // kill, however fast it runs.
  w[0]->Signal(SIGSTOP);
  ASSERT_LT(CurrentStep(port), kLong - 100) << "too fast for the kill";
  w[1]->Signal(SIGKILL);
  EXPECT_EQ(w[1]->Wait(absl::Seconds(30)), 128 + SIGKILL);
  const int64_t killed = CurrentStep(port);
  w[0]->Signal(SIGCONT);
  EXPECT_TRUE(WaitForStep(port, killed + 30, absl::Minutes(1)))
      << "the job waits for the killed worker";
  // dp-ps logs the loss on its next look at the leases (every 100 ms),
  // which 30 fast steps may well come before.
  EXPECT_TRUE(ps[0]->WaitForOutput("rank 1 is missing: its connection closed",
                                   absl::Minutes(1)))
      << ps[0]->output();
  EXPECT_EQ(w[0]->Wait(kJobTimeout), 0) << w[0]->output();
  for (auto& p : ps) EXPECT_EQ(p->Wait(kJobTimeout), 0) << p->output();
  EXPECT_TRUE(ReadModel(model) == reference);
}

TEST(ElasticJobTest, AKilledWorkerIsMissedAtOnce) {
  AKilledWorkerIsMissedAtOnce(1);
}

TEST(ElasticJobTest, AKilledWorkerIsMissedAtOnceWithShards) {
  AKilledWorkerIsMissedAtOnce(2);
}

// Recovery in a mix with elasticity: a worker killed without replacement,
// dp-ps (or a shard) killed -9 and restarted from its checkpoint, a new
// worker without a rank joining, then another shard (or dp-ps again)
// killed: the model of 4 workers throughout, byte for byte.
void KillsOfEverything(int shards) {
  TempDir dir;
  const std::string reference = ModelOf(dir, 4, 1, kLong);
  const std::string model = dir.File("model.safetensors");
  std::vector<std::string> flags = ElasticFlags(model);
  flags.push_back("--checkpoint_every=20");
  RestartableShards ps(shards, flags, dir);
  const int port = ps.port(0);
  const std::string list = ps.list();
  std::vector<std::unique_ptr<Subprocess>> w;
  for (int r = 0; r < 4; ++r) w.push_back(StartWorker(list, r));
  ASSERT_TRUE(WaitForStep(port, 100, absl::Minutes(2)));
  w[3]->Signal(SIGKILL);
  EXPECT_EQ(w[3]->Wait(absl::Seconds(30)), 128 + SIGKILL);
  ASSERT_TRUE(WaitForStep(port, CurrentStep(port) + 60, absl::Minutes(2)));
  ASSERT_TRUE(ps.KillAndRestart(0));
  ASSERT_TRUE(WaitForStep(port, CurrentStep(port) + 60, absl::Minutes(2)));
  // The restarted dp-ps knows no process: a worker without a rank that
  // came before a survivor registered again could take the survivor's
  // rank (its lease, 1 s, may have run out while it retried), and the
  // survivor would stand by.
  ASSERT_TRUE(WaitForRegistered(port, {0, 1, 2}, absl::Minutes(2)));
  w[3] = StartWorker(list, -1);
  ASSERT_TRUE(w[3]->WaitForOutput("joined at step", absl::Minutes(2)))
      << w[3]->output();
  ASSERT_TRUE(WaitForStep(port, CurrentStep(port) + 60, absl::Minutes(2)));
  // Held for the last kill, so that the job cannot end before it.
  Hold(w, SIGSTOP);
  ASSERT_LT(CurrentStep(port), kLong - 100) << "too fast for the kills";
  ASSERT_TRUE(ps.KillAndRestart(shards - 1));
  Hold(w, SIGCONT);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(w[r]->Wait(kJobTimeout), 0) << w[r]->output();
  }
  ps.ExpectAllExitZero();
  EXPECT_TRUE(ReadModel(model) == reference);
}

TEST(ElasticJobTest, ServerKillsAmongWorkersLeavingAndJoiningChangeNothing) {
  KillsOfEverything(1);
}

TEST(ElasticJobTest, ShardKillsAmongWorkersLeavingAndJoiningChangeNothing) {
  KillsOfEverything(2);
}

// The job does not wait for rank 0: rank 1 trains it to the end alone, and
// rank 0, joining after the last step, still evaluates the final weights.
TEST(ElasticJobTest, RankZeroJoiningAtTheEndEvaluatesTheFinalWeights) {
  int port = 0;
  auto ps =
      StartServer({"--workers=2", "--max_steps=30", "--start_wait_s=0"}, &port);
  auto w1 = StartWorker(port, 1);
  EXPECT_EQ(w1->Wait(kJobTimeout), 0) << w1->output();
  ASSERT_TRUE(WaitForStep(port, 30, absl::Minutes(1)));
  auto w0 = StartWorker(port, 0);
  EXPECT_EQ(w0->Wait(kJobTimeout), 0) << w0->output();
  EXPECT_NE(w0->output().find("joined at step 30 of 30"), std::string::npos)
      << w0->output();
  EXPECT_EQ(ps->Wait(kJobTimeout), 0) << ps->output();
  EXPECT_NE(ps->output().find("final test accuracy:"), std::string::npos)
      << ps->output();
}

// A worker stopped (SIGSTOP) for many steps, then continued: its blocks are
// backed up by the others meanwhile (it is never declared lost: the lease
// is long), and the model is the same.
TEST(ElasticJobTest, AStoppedWorkerIsBackedUpAndTheModelIsTheSame) {
  TempDir dir;
  const std::string reference = ModelOf(dir, 4);
  const std::string model = dir.File("model.safetensors");
  std::vector<std::string> flags = Flags(model);
  flags.push_back("--workers=4");
  flags.push_back("--worker_timeout_s=600");
  int port = 0;
  auto ps = StartServer(flags, &port);
  std::vector<std::unique_ptr<Subprocess>> w;
  for (int r = 0; r < 4; ++r) w.push_back(StartWorker(port, r));
  ASSERT_TRUE(WaitForStep(port, 20, absl::Minutes(2)));
  w[1]->Signal(SIGSTOP);
  const int64_t stopped = CurrentStep(port);
  EXPECT_TRUE(WaitForStep(port, stopped + 40, absl::Minutes(2)))
      << "the job waited for the stopped worker";
  w[1]->Signal(SIGCONT);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(w[r]->Wait(kJobTimeout), 0) << w[r]->output();
  }
  EXPECT_EQ(ps->Wait(kJobTimeout), 0) << ps->output();
  EXPECT_TRUE(ReadModel(model) == reference);
  // dp-ps's end line: "... reassigned, N late blocks backed up, ...".
  int backups = -1;
  const auto line = ps->Field(" blocks of lost workers reassigned, ");
  ASSERT_TRUE(line.has_value()) << ps->output();
  ASSERT_EQ(std::sscanf(line->c_str(), "%d late blocks backed up", &backups), 1)
      << *line;
  EXPECT_GT(backups, 0) << ps->output();
}

}  // namespace
}  // namespace dp
