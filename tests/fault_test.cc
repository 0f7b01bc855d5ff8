// Failures with real processes and real signals: a job that loses any
// process and gets it back finishes with exactly the weights it would have
// had without the failure, and nothing hangs.
#include <signal.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/dataset.h"
#include "common/file_util.h"
#include "common/flags.h"
#include "common/model_layout.h"
#include "gtest/gtest.h"
#include "proto/dp.grpc.pb.h"
#include "server/checkpoint.h"
#include "tests/job_runner.h"
#include "tests/raw_client.h"

namespace dp {
namespace {

constexpr int kSteps = 300;

// The job of these tests; JobFlags(model) adds its 2 workers and the model
// file.
const std::vector<std::string> kJob = {absl::StrCat("--max_steps=", kSteps),
                                       "--batch_size=32", "--seed=9"};

std::vector<std::string> JobFlags(const std::string& model) {
  std::vector<std::string> flags = kJob;
  flags.push_back("--workers=2");
  flags.push_back("--save_model=" + model);
  return flags;
}

// The model of the same job without failures.
std::string Reference() { return ReferenceModel(kJob, 2); }

// The seed of a test's kill points: DP_FAULT_SEED when set, so that a
// failure can be replayed, a fresh one otherwise. Printed either way.
uint64_t FaultSeed() {
  uint64_t seed = 0;
  const char* env = std::getenv("DP_FAULT_SEED");
  if (env != nullptr && *env != '\0') {
    if (!absl::SimpleAtoi(env, &seed)) {
      ADD_FAILURE() << "DP_FAULT_SEED=" << env << " is not a number";
    }
  } else {
    seed = (uint64_t{std::random_device{}()} << 32) | std::random_device{}();
  }
  std::printf("fault seed: %llu (replay with DP_FAULT_SEED=%llu)\n",
              static_cast<unsigned long long>(seed),
              static_cast<unsigned long long>(seed));
  ::testing::Test::RecordProperty("fault_seed", absl::StrCat(seed));
  return seed;
}

int64_t RandomStep(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  const int64_t s = std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  std::printf("chosen step: %lld\n", static_cast<long long>(s));
  return s;
}

// dp-ps's status once its step waits for rank 1's block alone (the others'
// are in), or nullopt after a minute.
std::optional<dp::v1::GetStatusResponse> WaitUntilOnlyRankOneIsWaitedFor(
    int port) {
  return WaitForStatus(
      port,
      [](const dp::v1::GetStatusResponse& s) {
        return s.waits_for_size() == 1 && s.waits_for(0) == 1;
      },
      absl::Minutes(1));
}

// With --on_worker_loss=wait and no backups the step waits for the killed
// rank, whose restart joins at that step (elastic_job_test.cc has the job
// going on without it).
TEST(FaultTest, KilledWorkerRestartedGivesByteIdenticalModel) {
  TempDir dir;
  const std::string reference = Reference();
  const std::string model = dir.File("model.safetensors");
  std::vector<std::string> flags = JobFlags(model);
  flags.push_back("--on_worker_loss=wait");
  flags.push_back("--backup_blocks=0");
  int port = 0;
  auto ps = StartServer(flags, &port);
  auto w0 = StartWorker(port, 0);
  auto w1 = StartWorker(port, 1);
  std::mt19937_64 rng(FaultSeed());
  ASSERT_TRUE(WaitForStep(port, RandomStep(rng, 10, 200), absl::Minutes(2)));
  w1->Signal(SIGKILL);
  EXPECT_EQ(w1->Wait(absl::Seconds(30)), 128 + SIGKILL);
  // A push of the killed rank may still count after the kill, so the step
  // read at once can still move: the step the job waits at is the one
  // whose only missing block is rank 1's.
  const auto waiting = WaitUntilOnlyRankOneIsWaitedFor(port);
  ASSERT_TRUE(waiting.has_value()) << ps->output();
  const int64_t killed_at = waiting->step();
  w1 = StartWorker(port, 1);
  EXPECT_EQ(w0->Wait(kJobTimeout), 0) << w0->output();
  EXPECT_EQ(w1->Wait(kJobTimeout), 0) << w1->output();
  EXPECT_EQ(ps->Wait(kJobTimeout), 0) << ps->output();
  EXPECT_NE(w1->output().find(absl::StrCat("joined at step ", killed_at)),
            std::string::npos)
      << w1->output();
  EXPECT_TRUE(ReadModel(model) == reference);
}

TEST(FaultTest, KilledServerRestartedFromCheckpointGivesByteIdenticalModel) {
  TempDir dir;
  const std::string reference = Reference();
  const std::string model = dir.File("model.safetensors");
  std::vector<std::string> flags = JobFlags(model);
  flags.push_back("--checkpoint_dir=" + dir.File("ckpt"));
  flags.push_back("--checkpoint_every=25");
  int port = 0;
  auto ps = StartServer(flags, &port);
  auto w0 = StartWorker(port, 0);
  auto w1 = StartWorker(port, 1);
  std::mt19937_64 rng(FaultSeed());
  const int64_t chosen = RandomStep(rng, 30, 220);
  ASSERT_TRUE(WaitForStep(port, chosen, absl::Minutes(2)));
  // Held, so that the job cannot end before the kill: checkpoints are
  // written in the background, and the one of the last multiple of 25 may
  // land many steps later.
  w0->Signal(SIGSTOP);
  w1->Signal(SIGSTOP);
  ASSERT_TRUE(
      WaitForFile(dir.File("ckpt/" + CheckpointFileName(chosen / 25 * 25)),
                  absl::Minutes(1)));
  ps->Signal(SIGKILL);
  EXPECT_EQ(ps->Wait(absl::Seconds(30)), 128 + SIGKILL);
  int again = 0;
  ps = StartServer(flags, &again, port);
  ASSERT_EQ(again, port) << ps->output();
  EXPECT_NE(ps->output().find("resuming from the checkpoint of step"),
            std::string::npos)
      << ps->output();
  w0->Signal(SIGCONT);
  w1->Signal(SIGCONT);
  EXPECT_EQ(w0->Wait(kJobTimeout), 0) << w0->output();
  EXPECT_EQ(w1->Wait(kJobTimeout), 0) << w1->output();
  EXPECT_EQ(ps->Wait(kJobTimeout), 0) << ps->output();
  EXPECT_TRUE(ReadModel(model) == reference);
}

TEST(FaultTest, TruncatedAndCorruptCheckpointsAreSkippedSayingWhy) {
  TempDir dir;
  const std::string ckpt = dir.File("ckpt");
  std::vector<std::string> flags = {
      "--max_steps=40", "--batch_size=16", "--checkpoint_every=10",
      "--keep_checkpoints=10", "--checkpoint_dir=" + ckpt};
  JobResult r = RunJob(flags, 2);
  ASSERT_EQ(r.ps_exit, 0) << r.ps_output;
  const std::string newest = ckpt + "/" + CheckpointFileName(40);
  const std::string older = ckpt + "/" + CheckpointFileName(30);
  auto a = ReadFile(newest);
  auto b = ReadFile(older);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(WriteFileAtomic(newest, a->substr(0, a->size() - 1000)).ok());
  (*b)[b->size() / 2] ^= 0x01;
  ASSERT_TRUE(WriteFileAtomic(older, *b).ok());
  int port = 0;
  flags.push_back("--workers=2");
  flags.push_back("--max_steps=60");
  auto ps = StartServer(flags, &port);
  EXPECT_NE(ps->output().find(
                absl::StrCat("skipping checkpoint ", newest, ": truncated")),
            std::string::npos)
      << ps->output();
  EXPECT_NE(ps->output().find(absl::StrCat("skipping checkpoint ", older,
                                           ": checksum mismatch")),
            std::string::npos)
      << ps->output();
  EXPECT_NE(ps->output().find("resuming from the checkpoint of step 20"),
            std::string::npos)
      << ps->output();
  EXPECT_EQ(CurrentStep(port), 20);
  ps->Signal(SIGTERM);
  EXPECT_EQ(ps->Wait(kJobTimeout), kExitInterrupted);
}

TEST(FaultTest, CheckpointOfAnotherJobIsRefused) {
  TempDir dir;
  const std::string ckpt = "--checkpoint_dir=" + dir.File("ckpt");
  // A step of one micro-batch of 16.
  JobResult r = RunJob({"--max_steps=5", "--batch_size=16", ckpt}, 1);
  ASSERT_EQ(r.ps_exit, 0) << r.ps_output;
  // The same global batch in two micro-batches of 8 is another job.
  Subprocess other(
      {DP_PS_BINARY, "--port=0", "--global_batch=16", "--micro_batch=8", ckpt});
  EXPECT_EQ(other.Wait(absl::Seconds(30)), kExitConfigError);
  EXPECT_NE(
      other.output().find("a different job: --micro_batch=8 (saved: 16)\n"),
      std::string::npos)
      << other.output();
  // So is --batch_size=32 with its default global batch (32 x 2 workers).
  Subprocess bigger({DP_PS_BINARY, "--port=0", "--batch_size=32", ckpt});
  EXPECT_EQ(bigger.Wait(absl::Seconds(30)), kExitConfigError);
  EXPECT_NE(bigger.output().find(
                "--global_batch=64 (saved: 16), --micro_batch=32 (saved: 16)"),
            std::string::npos)
      << bigger.output();
  // More workers for the same step are the same job: it resumes.
  int port = 0;
  auto more = StartServer(
      {"--workers=4", "--global_batch=16", "--micro_batch=16", ckpt}, &port);
  EXPECT_NE(more->output().find("resuming from the checkpoint of step 5"),
            std::string::npos)
      << more->output();
  more->Signal(SIGTERM);
  EXPECT_EQ(more->Wait(absl::Seconds(30)), kExitInterrupted) << more->output();
}

// Every file of `dir` and its bytes: what a refused start must leave as it
// was.
std::map<std::string, std::string> FilesIn(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    auto bytes = ReadFile(e.path().string());
    files[e.path().filename().string()] = bytes.ok() ? *bytes : "unreadable";
  }
  return files;
}

// The optimiser's settings shape every update to come: a resume that
// changes them is refused, naming each change, with nothing written - the
// checkpoints stay as they were, no model is saved - unless
// --allow_hyperparameter_change, which logs what changed from which step.
// Under a cosine schedule the job's length is its T, so a longer job is a
// change too.
// A resume with another learning rate (--allow_hyperparameter_change)
// trains the model of an uninterrupted job whose rate changes at that
// step: 20 steps at 0.01, a checkpoint, then 20 at 0.005, against a step
// schedule that halves 0.01 at step 20 (halving a double is exact).
TEST(FaultTest, AResumeWithANewRateIsTheJobThatChangesItThere) {
  TempDir dir;
  const std::vector<std::string> job = {"--batch_size=16", "--seed=8",
                                        "--dataset=synthetic", "--epochs=100"};
  std::vector<std::string> reference = job;
  const std::string uninterrupted = dir.File("uninterrupted.safetensors");
  reference.insert(reference.end(),
                   {"--max_steps=40", "--lr=0.01", "--lr_schedule=step",
                    "--lr_step_every=20", "--lr_gamma=0.5",
                    "--save_model=" + uninterrupted});
  JobResult r = RunJob(reference, 2);
  ASSERT_EQ(r.ps_exit, 0) << r.ps_output;

  const std::string ckpt = "--checkpoint_dir=" + dir.File("ckpt");
  std::vector<std::string> first = job;
  first.insert(first.end(), {"--max_steps=20", "--lr=0.01", ckpt});
  r = RunJob(first, 2);
  ASSERT_EQ(r.ps_exit, 0) << r.ps_output;
  const std::string resumed = dir.File("resumed.safetensors");
  std::vector<std::string> second = job;
  second.insert(second.end(),
                {"--max_steps=40", "--lr=0.005", ckpt,
                 "--allow_hyperparameter_change", "--save_model=" + resumed});
  r = RunJob(second, 2);
  ASSERT_EQ(r.ps_exit, 0) << r.ps_output;
  EXPECT_NE(r.ps_output.find("resuming from the checkpoint of step 20"),
            std::string::npos)
      << r.ps_output;
  EXPECT_TRUE(ReadModel(resumed) == ReadModel(uninterrupted))
      << "the resumed job is not the job that changes its rate at step 20";
}

TEST(FaultTest, ResumeWithOtherOptimiserSettingsIsRefusedUnlessAllowed) {
  TempDir dir;
  const std::string ckpt = "--checkpoint_dir=" + dir.File("ckpt");
  const std::vector<std::string> saved = {
      "--global_batch=16",    "--micro_batch=16", ckpt,
      "--lr_schedule=cosine", "--warmup_steps=2", "--clip_grad_norm=1"};
  std::vector<std::string> first = saved;
  first.push_back("--max_steps=5");
  JobResult r = RunJob(first, 1);
  ASSERT_EQ(r.ps_exit, 0) << r.ps_output;
  const auto before = FilesIn(dir.File("ckpt"));
  ASSERT_FALSE(before.empty());
  const std::string model = dir.File("model.safetensors");

  struct Case {
    std::vector<std::string> flags;
    std::string error;
  };
  const std::vector<Case> cases = {
      {{"--max_steps=10"},
       "other optimiser settings: --epochs/--max_steps: the cosine "
       "schedule's total steps=10 (saved: 5) (--allow_hyperparameter_change "
       "resumes with the new ones)\n"},
      {{"--max_steps=5", "--lr_schedule=step", "--lr_step_every=2",
        "--clip_grad_norm=0.5", "--lr=0.002"},
       "other optimiser settings: --lr=0.002 (saved: 0.001), "
       "--lr_schedule=step (saved: cosine), --lr_step_every=2 (saved: 0), "
       "--clip_grad_norm=0.5 (saved: 1) (--allow_hyperparameter_change"},
      {{"--max_steps=5", "--optimizer=adamw", "--beta1=0.8", "--beta2=0.99",
        "--eps=1e-06", "--weight_decay=0.01"},
       "other optimiser settings: --optimizer=adamw (saved: adam), "
       "--beta1=0.8 (saved: 0.9), --beta2=0.99 (saved: 0.999), --eps=1e-06 "
       "(saved: 1e-08), --weight_decay=0.01 (saved: 0)"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {DP_PS_BINARY, "--port=0",
                                     "--save_model=" + model};
    argv.insert(argv.end(), saved.begin(), saved.end());
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    Subprocess refused(argv);
    EXPECT_EQ(refused.Wait(absl::Seconds(30)), kExitConfigError)
        << refused.output();
    EXPECT_NE(refused.output().find(c.error), std::string::npos)
        << refused.output();
    EXPECT_TRUE(FilesIn(dir.File("ckpt")) == before) << c.flags.back();
    EXPECT_FALSE(std::filesystem::exists(model)) << c.flags.back();
  }

  std::vector<std::string> allowed = saved;
  allowed.insert(allowed.end(),
                 {"--max_steps=10", "--lr_schedule=step", "--lr_step_every=2",
                  "--allow_hyperparameter_change"});
  int port = 0;
  auto ps = StartServer(allowed, &port);
  EXPECT_NE(ps->output().find("resuming from the checkpoint of step 5"),
            std::string::npos)
      << ps->output();
  EXPECT_NE(ps->output().find(
                "--allow_hyperparameter_change: the updates from step 5 on "
                "use other optimiser settings than the checkpoint's: "
                "--lr_schedule=step (saved: cosine), --lr_step_every=2 "
                "(saved: 0)\n"),
            std::string::npos)
      << ps->output();
  EXPECT_EQ(CurrentStep(port), 5);
  ps->Signal(SIGTERM);
  EXPECT_EQ(ps->Wait(absl::Seconds(30)), kExitInterrupted) << ps->output();
}

TEST(FaultTest, StoppedWorkerIsReportedAndFailPolicyEndsTheJob) {
  int port = 0;
  // A lease far above a healthy worker's silence (a step's compute) on a
  // loaded machine, so that only the stopped rank is lost. No backups: the
  // step waits for the stopped rank, so the job cannot end before its
  // lease does (rank 0 alone ran out 3 epochs within the 5 s on a fast
  // run).
  auto ps = StartServer({"--workers=2", "--max_steps=100000", "--batch_size=16",
                         "--worker_timeout_s=5", "--on_worker_loss=fail",
                         "--backup_blocks=0"},
                        &port);
  auto w0 = StartWorker(port, 0);
  auto w1 = StartWorker(port, 1);
  ASSERT_TRUE(WaitForStep(port, 20, absl::Minutes(2)));
  const absl::Time stopped = absl::Now();
  w1->Signal(SIGSTOP);
  EXPECT_TRUE(ps->WaitForOutput("rank 1 was lost", absl::Seconds(60)))
      << ps->output();
  std::printf("SIGSTOP to the report: %.2f s (--worker_timeout_s=5)\n",
              absl::ToDoubleSeconds(absl::Now() - stopped));
  EXPECT_EQ(ps->Wait(absl::Seconds(60)), kExitFailure) << ps->output();
  // The healthy worker ends with the error instead of hanging.
  const auto w0_exit = w0->Wait(absl::Seconds(60));
  ASSERT_TRUE(w0_exit.has_value());
  EXPECT_NE(*w0_exit, 0);
  EXPECT_NE(w0->output().find("rank 1 was lost"), std::string::npos)
      << w0->output();
  w1->Signal(SIGKILL);
}

// A killed worker's connection closes: the fail policy ends the job at
// once, not after the lease (10 minutes here).
TEST(FaultTest, KilledWorkerEndsAFailPolicyJobAtOnce) {
  int port = 0;
  auto ps = StartServer({"--workers=2", "--max_steps=100000", "--batch_size=16",
                         "--worker_timeout_s=600", "--on_worker_loss=fail"},
                        &port);
  // Rank 0 is told why the job ended (exit 1), whether it was waiting or
  // computing when it failed: dp-ps goes only once its telling is written,
  // through the step channel too. A short retry, so that a rank 0 met by a
  // closed port instead fails the check (exit 4) within the test's wait.
  auto w0 = StartWorker(port, 0, {"--retry_for_s=10"});
  auto w1 = StartWorker(port, 1);
  ASSERT_TRUE(WaitForStep(port, 20, absl::Minutes(2)));
  w1->Signal(SIGKILL);
  EXPECT_EQ(ps->Wait(absl::Seconds(60)), kExitFailure) << ps->output();
  EXPECT_NE(ps->output().find("rank 1 was lost (its connection closed"),
            std::string::npos)
      << ps->output();
  const auto w0_exit = w0->Wait(absl::Seconds(60));
  ASSERT_TRUE(w0_exit.has_value()) << w0->output();
  EXPECT_EQ(*w0_exit, kExitFailure) << w0->output() << ps->output();
}

// A worker waiting for a step when dp-ps dies (-9, never to come back) gives
// up after --retry_for_s with exit 4 (dp-ps unreachable), whatever its
// --wait_timeout_s: waiting for a connection is not waiting for a step.
// A process killed between its registration and its Attend call (here a
// registration over a raw stub, which never attends nor calls again) holds
// its rank unseen until its lease runs out: the job goes on without it (its
// late block backed up, then left out of the plan). At the end dp-ps does
// not wait for it to go, since its going could never be seen: it exits
// once the worker that attended is gone.
TEST(FaultTest, ARankThatNeverAttendedIsNotWaitedForAtTheEnd) {
  int port = 0;
  auto ps = StartServer(
      {"--dataset=synthetic", "--workers=2", "--max_steps=20", "--batch_size=8",
       "--worker_timeout_s=600", "--final_eval_timeout_s=30"},
      &port);
  ASSERT_GT(port, 0) << ps->output();
  auto stub = ConnectRaw(port);
  ASSERT_TRUE(
      RawRegister(*stub, RawRegisterRequest(
                             1, ModelLayout::SimpleNet().Fingerprint(),
                             MakeSynthetic(0, Split::kTrain).fingerprint))
          .ok());
  auto w0 = StartWorker(port, 0);
  EXPECT_EQ(w0->Wait(kJobTimeout), 0) << w0->output();
  EXPECT_EQ(ps->Wait(kJobTimeout), 0) << ps->output();
  EXPECT_EQ(ps->output().find("still connected"), std::string::npos)
      << ps->output();
}

TEST(FaultTest, AWorkerWaitingWhenDpPsDiesExitsUnreachableAfterRetryFor) {
  int port = 0;
  auto ps = StartServer(
      {"--workers=2", "--max_steps=100000", "--batch_size=16",
       "--on_worker_loss=wait", "--backup_blocks=0", "--worker_timeout_s=600"},
      &port);
  const std::vector<std::string> worker_flags = {"--wait_timeout_s=1",
                                                 "--retry_for_s=3"};
  auto w0 = StartWorker(port, 0, worker_flags);
  auto w1 = StartWorker(port, 1, worker_flags);
  ASSERT_TRUE(WaitForStep(port, 10, absl::Minutes(2)));
  w1->Signal(SIGSTOP);
  // Rank 0 waits for rank 1's block.
  ASSERT_TRUE(WaitUntilOnlyRankOneIsWaitedFor(port).has_value());
  ps->Signal(SIGKILL);
  EXPECT_EQ(ps->Wait(absl::Seconds(30)), 128 + SIGKILL);
  EXPECT_EQ(w0->Wait(absl::Minutes(2)), kExitPsUnreachable) << w0->output();
  EXPECT_NE(w0->output().find("is unavailable for"), std::string::npos)
      << w0->output();
  w1->Signal(SIGKILL);
}

TEST(FaultTest, StoppedWorkerIsReportedAndWaitPolicyFinishesAfterSigcont) {
  TempDir dir;
  const std::string reference = Reference();
  const std::string model = dir.File("model.safetensors");
  std::vector<std::string> flags = JobFlags(model);
  flags.push_back("--worker_timeout_s=1");
  // Neither reassigned nor backed up: the step waits for the rank.
  flags.push_back("--on_worker_loss=wait");
  flags.push_back("--backup_blocks=0");
  int port = 0;
  auto ps = StartServer(flags, &port);
  auto w0 = StartWorker(port, 0);
  auto w1 = StartWorker(port, 1);
  std::mt19937_64 rng(FaultSeed());
  ASSERT_TRUE(WaitForStep(port, RandomStep(rng, 10, 150), absl::Minutes(2)));
  w1->Signal(SIGSTOP);
  EXPECT_TRUE(ps->WaitForOutput("rank 1 is missing", absl::Seconds(30)))
      << ps->output();
  w1->Signal(SIGCONT);
  EXPECT_EQ(w0->Wait(kJobTimeout), 0) << w0->output();
  EXPECT_EQ(w1->Wait(kJobTimeout), 0) << w1->output();
  EXPECT_EQ(ps->Wait(kJobTimeout), 0) << ps->output();
  EXPECT_NE(ps->output().find("rank 1 is back after"), std::string::npos);
  EXPECT_TRUE(ReadModel(model) == reference);
}

TEST(FaultTest, UnwritableCheckpointsAreReportedAndTrainingGoesOn) {
  TempDir dir;
  const std::string reference = Reference();
  const std::string model = dir.File("model.safetensors");
  // A file-size limit below a checkpoint's size (2.8 MB) but above the
  // model's (0.94 MB): every checkpoint write fails as on a full disk.
  std::vector<std::string> argv = {"/usr/bin/prlimit",
                                   "--fsize=1500000",
                                   DP_PS_BINARY,
                                   "--host=127.0.0.1",
                                   "--port=0",
                                   "--checkpoint_every=50",
                                   "--checkpoint_dir=" + dir.File("ckpt")};
  for (const std::string& f : JobFlags(model)) argv.push_back(f);
  Subprocess ps(argv);
  ASSERT_TRUE(ps.WaitForOutput(" workers\n", absl::Seconds(30))) << ps.output();
  int port = std::stoi(*ps.Field("listening on 127.0.0.1:"));
  auto w0 = StartWorker(port, 0);
  auto w1 = StartWorker(port, 1);
  EXPECT_EQ(w0->Wait(kJobTimeout), 0) << w0->output();
  EXPECT_EQ(w1->Wait(kJobTimeout), 0) << w1->output();
  EXPECT_EQ(ps.Wait(kJobTimeout), 0) << ps.output();
  EXPECT_NE(ps.output().find("cannot write checkpoint of step 50"),
            std::string::npos)
      << ps.output();
  EXPECT_NE(ps.output().find("File too large"), std::string::npos);
  EXPECT_TRUE(ReadModel(model) == reference);
}

// Random kill -9 of workers and dp-ps shards (`shards` of them, each with
// its own checkpoint directory), each restarted at once: the job still ends
// with the model of the uninterrupted unsharded job, byte for byte. The
// steps wait for a killed worker (--on_worker_loss=wait, no backups), so
// that its restart always has steps left to join; elastic_job_test.cc has
// the job going on without it.
void Chaos(int shards) {
  TempDir dir;
  const std::string reference = Reference();
  const std::string model = dir.File("model.safetensors");
  std::vector<std::string> flags = JobFlags(model);
  flags.push_back("--checkpoint_every=20");
  flags.push_back("--on_worker_loss=wait");
  flags.push_back("--backup_blocks=0");
  RestartableShards ps(shards, flags, dir);
  const std::string addresses = ps.list();
  std::vector<std::unique_ptr<Subprocess>> w;
  w.push_back(StartWorker(addresses, 0));
  w.push_back(StartWorker(addresses, 1));
  std::mt19937_64 rng(FaultSeed());
  int64_t at = 0;
  const absl::Time deadline = absl::Now() + absl::Minutes(3);
  for (int round = 0; round < 5 && absl::Now() < deadline; ++round) {
    at += std::uniform_int_distribution<int>(15, 45)(rng);
    if (at > kSteps - 40 || !WaitForStep(ps.port(0), at, absl::Minutes(1))) {
      break;
    }
    // Victims 0 and 1 are the workers, 2.. the shards.
    const int victim = std::uniform_int_distribution<int>(0, 1 + shards)(rng);
    if (victim >= 2) {
      const int k = victim - 2;
      std::printf("round %d: kill dp-ps shard %d at step >= %lld\n", round, k,
                  static_cast<long long>(at));
      ASSERT_TRUE(ps.KillAndRestart(k));
      at = std::max<int64_t>(0, CurrentStep(ps.port(k)));
    } else {
      std::printf("round %d: kill worker %d at step >= %lld\n", round, victim,
                  static_cast<long long>(at));
      w[victim]->Signal(SIGKILL);
      w[victim]->Wait(absl::Seconds(30));
      w[victim] = StartWorker(addresses, victim);
    }
  }
  EXPECT_EQ(w[0]->Wait(kJobTimeout), 0) << w[0]->output();
  EXPECT_EQ(w[1]->Wait(kJobTimeout), 0) << w[1]->output();
  ps.ExpectAllExitZero();
  EXPECT_TRUE(ReadModel(model) == reference);
}

TEST(FaultTest, ChaosOfWorkerAndServerKillsGivesByteIdenticalModel) {
  Chaos(1);
}

TEST(FaultTest, ChaosOfWorkerAndShardKillsGivesTheUnshardedModel) { Chaos(2); }

}  // namespace
}  // namespace dp
