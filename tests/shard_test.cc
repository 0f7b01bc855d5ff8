// Sharded jobs with real processes: S dp-ps shards compute bitwise the model
// one dp-ps computes, and a shard that restarts from an older checkpoint
// rolls the job back to a step every shard holds, again to the same model.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/flags.h"
#include "gtest/gtest.h"
#include "server/checkpoint.h"
#include "tests/job_runner.h"

namespace dp {
namespace {

// The model of a job of 2 workers with `flags` on `shards` shards.
std::string TrainedModel(const TempDir& dir, std::vector<std::string> flags,
                         int shards) {
  const std::string path = dir.File(absl::StrCat("model-", shards, ".st"));
  flags.push_back("--save_model=" + path);
  JobResult r = RunJob(flags, 2, {}, shards);
  EXPECT_EQ(r.ps_exit, 0) << r.ps_output;
  if (shards > 1) {
    EXPECT_NE(r.ps_output.find(absl::StrCat("from ", shards, " shards")),
              std::string::npos)
        << r.ps_output;
  }
  return ReadModel(path);
}

TEST(ShardTest, OneTwoAndThreeShardsTrainTheSameModelToTheBit) {
  TempDir dir;
  const std::vector<std::string> flags = {
      "--dataset=synthetic", "--max_steps=40", "--batch_size=32", "--seed=11"};
  const std::string one = TrainedModel(dir, flags, 1);
  ASSERT_FALSE(one.empty());
  EXPECT_TRUE(TrainedModel(dir, flags, 2) == one) << "2 shards differ";
  EXPECT_TRUE(TrainedModel(dir, flags, 3) == one) << "3 shards differ";
}

TEST(ShardTest, Bf16ShardsTrainTheSameModelAsOneDpPs) {
  TempDir dir;
  const std::vector<std::string> flags = {
      "--dataset=synthetic",  "--max_steps=30",
      "--batch_size=16",      "--seed=3",
      "--grad_encoding=bf16", "--weight_encoding=bf16"};
  const std::string one = TrainedModel(dir, flags, 1);
  ASSERT_FALSE(one.empty());
  EXPECT_TRUE(TrainedModel(dir, flags, 2) == one);
}

TEST(ShardTest, TwoShardsTrainFashionMnistToTheModelOfOneDpPs) {
  TempDir dir;
  const std::vector<std::string> flags = {"--epochs=1", "--batch_size=64",
                                          "--seed=2"};
  const std::string one = TrainedModel(dir, flags, 1);
  ASSERT_FALSE(one.empty());
  EXPECT_TRUE(TrainedModel(dir, flags, 2) == one);
}

// A job of two shards stopped at step 37 (its --max_steps then), each shard
// checkpointed every 10 steps and at the end; shard 1's checkpoint of 37
// is lost (as one not yet written when a shard is killed is), so shard 1
// resumes at 30 while shard 0 resumes at 37 when both are started again to
// go on to step 80. The workers' join rolls shard 0 back, they redo the
// steps, and the model is the one of the job without the stop. Stopped by
// its own --max_steps, the job is where the test wants it at any speed.
TEST(ShardTest, AShardRestartedFromAnOlderCheckpointRollsTheJobBack) {
  TempDir dir;
  std::vector<std::string> flags = {"--dataset=synthetic", "--batch_size=16",
                                    "--seed=8"};
  std::vector<std::string> full = flags;
  full.push_back("--max_steps=80");
  const std::string reference = TrainedModel(dir, full, 1);
  const std::string model = dir.File("model.st");
  flags.push_back("--workers=2");
  flags.push_back("--checkpoint_every=10");
  flags.push_back("--save_model=" + model);
  std::vector<std::string> shard_flags[2] = {flags, flags};
  shard_flags[0].push_back("--checkpoint_dir=" + dir.File("ckpt0"));
  shard_flags[1].push_back("--checkpoint_dir=" + dir.File("ckpt1"));
  std::vector<int> ports = {0, 0};
  // Starts both shards with --max_steps=`steps` and two workers.
  auto run = [&](int steps) {
    std::vector<std::unique_ptr<Subprocess>> p;
    for (int k : {1, 0}) {
      std::vector<std::string> args = shard_flags[k];
      args.push_back(absl::StrCat("--max_steps=", steps));
      int port = 0;
      p.push_back(StartServer(ShardArgs(args, k, ports), &port, ports[k]));
      ports[k] = port;
    }
    std::reverse(p.begin(), p.end());  // p[k] is shard k
    for (int r = 0; r < 2; ++r) p.push_back(StartWorker(PsList(ports), r));
    return p;
  };
  {
    auto first = run(37);
    for (auto& p : first) EXPECT_EQ(p->Wait(kJobTimeout), 0) << p->output();
  }
  ASSERT_TRUE(
      std::filesystem::remove(dir.File("ckpt1/" + CheckpointFileName(37))));
  ASSERT_TRUE(
      std::filesystem::exists(dir.File("ckpt1/" + CheckpointFileName(30))));
  auto second = run(80);
  for (auto& p : second) EXPECT_EQ(p->Wait(kJobTimeout), 0) << p->output();
  EXPECT_NE(second[1]->output().find("resuming from the checkpoint of step 30"),
            std::string::npos)
      << second[1]->output();
  EXPECT_NE(second[0]->output().find("rolled back from step 37 to step 30"),
            std::string::npos)
      << second[0]->output();
  EXPECT_TRUE(ReadModel(model) == reference);
}

// A worker alone at the barrier of a sharded job says whom it waits for,
// from every shard's status, and carries on when the rank comes.
TEST(ShardTest, AWaitingWorkerNamesTheRanksTheShardsLack) {
  std::vector<int> ports;
  auto ps = StartShards(
      2,
      {"--dataset=synthetic", "--workers=2", "--max_steps=5", "--batch_size=8"},
      &ports);
  auto w0 = StartWorker(PsList(ports), 0, {"--wait_timeout_s=1"});
  EXPECT_TRUE(w0->WaitForOutput("still waiting at step 0 for rank(s) 1\n",
                                absl::Seconds(60)))
      << w0->output();
  auto w1 = StartWorker(PsList(ports), 1);
  EXPECT_EQ(w0->Wait(kJobTimeout), 0) << w0->output();
  EXPECT_EQ(w1->Wait(kJobTimeout), 0) << w1->output();
  for (auto& p : ps) EXPECT_EQ(p->Wait(kJobTimeout), 0) << p->output();
}

// A worker stopped (SIGSTOP) near the end, whose last blocks the other
// computed, is late: the job ends without it. When it goes on, dp-ps and
// every shard are still there (dp-ps, shard 0, waits for every worker to
// go, and only then lets the other shards go), so it pushes its stale
// block, hears of the end and exits 0.
TEST(ShardTest, AWorkerLateForTheEndStillFindsEveryShard) {
  for (const int shards : {1, 2}) {
    SCOPED_TRACE(absl::StrCat(shards, " shard(s)"));
    std::vector<int> ports;
    auto ps =
        StartShards(shards,
                    {"--dataset=synthetic", "--workers=2", "--max_steps=40",
                     "--batch_size=8", "--worker_timeout_s=600"},
                    &ports);
    auto w0 = StartWorker(PsList(ports), 0);
    auto w1 = StartWorker(PsList(ports), 1, {"--retry_for_s=10"});
    ASSERT_TRUE(WaitForStep(ports[0], 5, kJobTimeout)) << ps[0]->output();
    w1->Signal(SIGSTOP);
    const auto done = WaitForStatus(
        ports[0], [](const dp::v1::GetStatusResponse& s) { return s.done(); },
        kJobTimeout);
    ASSERT_TRUE(done.has_value()) << ps[0]->output();
    EXPECT_EQ(w0->Wait(kJobTimeout), 0) << w0->output();
    w1->Signal(SIGCONT);
    EXPECT_EQ(w1->Wait(kJobTimeout), 0) << w1->output();
    for (auto& p : ps) EXPECT_EQ(p->Wait(kJobTimeout), 0) << p->output();
  }
}

// --ps as one name that resolves to every shard (as a headless Service's
// does): each worker runs with a private /etc/hosts (a mount namespace;
// root, as CI is) in which "dp-ps-multi" is 127.0.0.1 and 127.0.0.2, where
// the two shards listen on one port. The job finishes with the model of
// one dp-ps.
TEST(ShardTest, ANameThatResolvesToEveryShardReachesThemAll) {
  ASSERT_EQ(geteuid(), 0u) << "needs root for a mount namespace (CI is root)";
  TempDir dir;
  const std::vector<std::string> job = {"--dataset=synthetic", "--max_steps=20",
                                        "--batch_size=16", "--seed=6"};
  const std::string reference = TrainedModel(dir, job, 1);
  std::vector<std::string> flags = job;
  flags.push_back("--workers=2");
  const std::string model = dir.File("model.st");
  // Shard 1 on 127.0.0.2 (a free port), then shard 0 on 127.0.0.1, same port.
  std::vector<std::string> argv1 = {DP_PS_BINARY, "--host=127.0.0.2",
                                    "--port=0", "--shards=2", "--shard=1"};
  argv1.insert(argv1.end(), flags.begin(), flags.end());
  Subprocess s1(argv1);
  ASSERT_TRUE(s1.WaitForOutput(" workers\n", absl::Seconds(30))) << s1.output();
  const auto field = s1.Field("listening on 127.0.0.2:");
  ASSERT_TRUE(field.has_value()) << s1.output();
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(field->substr(0, field->find(' ')), &port));
  flags.push_back("--save_model=" + model);
  int port0 = 0;
  flags.insert(flags.end(),
               {"--shards=2", "--shard=0",
                absl::StrCat("--shard_addresses=127.0.0.2:", port)});
  auto s0 = StartServer(flags, &port0, port);
  ASSERT_EQ(port0, port) << s0->output();
  const std::string hosts = dir.File("hosts");
  ASSERT_TRUE(WriteFileAtomic(hosts,
                              "127.0.0.1 localhost\n"
                              "127.0.0.1 dp-ps-multi\n"
                              "127.0.0.2 dp-ps-multi\n")
                  .ok());
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int rank = 0; rank < 2; ++rank) {
    workers.push_back(std::make_unique<Subprocess>(std::vector<std::string>{
        "/usr/bin/unshare", "-m", "/bin/sh", "-c",
        absl::StrCat("mount --bind ", hosts, " /etc/hosts && exec ",
                     DP_WORKER_BINARY, " --ps=dp-ps-multi:", port,
                     " --rank=", rank, " --backend=cpu")}));
  }
  for (auto& w : workers) {
    EXPECT_EQ(w->Wait(kJobTimeout), 0) << w->output();
    EXPECT_NE(w->output().find(absl::StrCat("dp-ps shards: ipv4:127.0.0.1:",
                                            port, ",ipv4:127.0.0.2:", port)),
              std::string::npos)
        << w->output();
  }
  EXPECT_EQ(s1.Wait(kJobTimeout), 0) << s1.output();
  EXPECT_EQ(s0->Wait(kJobTimeout), 0) << s0->output();
  EXPECT_TRUE(ReadModel(model) == reference);
}

// dp-ps --export_checkpoint turns the checkpoints of a job's last step
// into the model the job saved, without a job: one dp-ps's file, or one of
// each shard's in any order. Files that are not one whole model of one
// step are refused (exit 2) naming the problem, and nothing is written.
void CheckpointsExportToTheSavedModel(int shards) {
  TempDir dir;
  const std::string saved = dir.File("saved.safetensors");
  RestartableShards ps(shards,
                       {"--workers=2", "--max_steps=40", "--batch_size=16",
                        "--dataset=synthetic", "--epochs=100", "--seed=6",
                        "--checkpoint_every=20", "--save_model=" + saved},
                       dir);
  auto w0 = StartWorker(ps.list(), 0);
  auto w1 = StartWorker(ps.list(), 1);
  EXPECT_EQ(w0->Wait(kJobTimeout), 0) << w0->output();
  EXPECT_EQ(w1->Wait(kJobTimeout), 0) << w1->output();
  ps.ExpectAllExitZero();
  std::vector<std::string> last, earlier;  // shard 1 first: any order
  for (int k = shards - 1; k >= 0; --k) {
    const std::string ckpt = dir.File(absl::StrCat("ckpt", k));
    last.push_back(absl::StrCat(ckpt, "/", CheckpointFileName(40)));
    earlier.push_back(absl::StrCat(ckpt, "/", CheckpointFileName(20)));
  }
  const std::string out = dir.File("exported.safetensors");
  Subprocess exported({DP_PS_BINARY,
                       "--export_checkpoint=" + absl::StrJoin(last, ","),
                       "--save_model=" + out});
  ASSERT_EQ(exported.Wait(absl::Seconds(60)), 0) << exported.output();
  EXPECT_NE(exported.output().find("wrote the model of step 40"),
            std::string::npos)
      << exported.output();
  EXPECT_TRUE(ReadModel(out) == ReadModel(saved))
      << "the exported model is not the one the job saved";

  const std::string corrupt = dir.File("corrupt.dpckpt");
  ASSERT_TRUE(WriteFileAtomic(corrupt, "not a checkpoint").ok());
  std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{corrupt}, "bad magic"}, {{dir.File("none.dpckpt")}, "none.dpckpt"}};
  if (shards > 1) {
    bad.push_back({{last[0]}, "is missing"});
    bad.push_back({{last[0], last[0]}, "given twice"});
    bad.push_back({{last[0], earlier[1]}, "is not of the job of"});
  }
  const std::string refused = dir.File("refused.safetensors");
  for (const auto& [files, message] : bad) {
    SCOPED_TRACE(message);
    Subprocess p({DP_PS_BINARY,
                  "--export_checkpoint=" + absl::StrJoin(files, ","),
                  "--save_model=" + refused});
    EXPECT_EQ(p.Wait(absl::Seconds(60)), kExitConfigError) << p.output();
    EXPECT_NE(p.output().find(message), std::string::npos) << p.output();
    EXPECT_FALSE(std::filesystem::exists(refused)) << "a refused export wrote";
  }
}

TEST(ShardTest, OneDpPsCheckpointExportsToTheSavedModel) {
  CheckpointsExportToTheSavedModel(1);
}

TEST(ShardTest, EveryShardsCheckpointTogetherExportToTheSavedModel) {
  CheckpointsExportToTheSavedModel(2);
}

TEST(ShardTest, ShardsOfDifferentJobsAreRefusedNamingBoth) {
  TempDir dir;
  std::vector<int> ports = {0, 0};
  auto s1 = StartServer(
      ShardArgs({"--dataset=synthetic", "--workers=1", "--seed=1"}, 1, ports),
      &ports[1]);
  auto s0 = StartServer(
      ShardArgs({"--dataset=synthetic", "--workers=1", "--seed=2"}, 0, ports),
      &ports[0]);
  auto w = StartWorker(PsList(ports), 0, {"--retry_for_s=5"});
  EXPECT_EQ(w->Wait(absl::Minutes(1)), 2) << w->output();
  // Both named: the shard that differs, and shard 0 whose job it is not.
  EXPECT_NE(w->output().find(
                absl::StrCat("127.0.0.1:", ports[1], " (shard 1 of 2 [")),
            std::string::npos)
      << w->output();
  EXPECT_NE(w->output().find(absl::StrCat("is not a shard of the job shard 0 "
                                          "(127.0.0.1:",
                                          ports[0], ") runs")),
            std::string::npos)
      << w->output();
  // A worker told of one shard only learns that the job has two.
  auto lone =
      StartWorker(absl::StrCat("127.0.0.1:", ports[0]), 0, {"--retry_for_s=5"});
  EXPECT_EQ(lone->Wait(absl::Minutes(1)), 2) << lone->output();
  EXPECT_NE(lone->output().find(absl::StrCat("names 1 dp-ps address(es), but "
                                             "127.0.0.1:",
                                             ports[0], " is shard 0 of 2")),
            std::string::npos)
      << lone->output();
  s0->Signal(SIGTERM);
  s1->Signal(SIGTERM);
}

}  // namespace
}  // namespace dp
