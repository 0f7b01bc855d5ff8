// Checkpoints: exact round trip, corruption detected, newest valid one
// chosen, retention, compatibility of job configurations.
#include "server/checkpoint.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>

#include "common/file_util.h"
#include "gtest/gtest.h"
#include "proto/dp.pb.h"
#include "proto/wire.h"
#include "tests/same_state.h"
#include "tests/subprocess.h"

namespace dp {
namespace {

const ModelLayout kLayout = ModelLayout::Mlp({6, 5, 3});

Checkpoint Make(int64_t step) {
  Checkpoint c;
  c.config.schedule.world_size = 2;
  c.config.schedule.batch_size = 8;
  c.config.dataset = "synthetic";
  c.data = DataFingerprint{1000, 0xabcdef};
  c.state.step = step;
  c.state.params = InitParams(kLayout, step);
  c.state.m.assign(kLayout.num_params(), 0.25f * step);
  c.state.v.assign(kLayout.num_params(), 0.5f * step);
  return c;
}

TEST(CheckpointTest, RoundTripIsBitExact) {
  const Checkpoint c = Make(42);
  auto back = DecodeCheckpoint(kLayout, EncodeCheckpoint(kLayout, c));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(SameState(c.state, back->state));
  ASSERT_TRUE(back->data.has_value());
  EXPECT_EQ(*back->data, *c.data);
  EXPECT_TRUE(CheckResumable(c.config, back->config).ok());
}

TEST(CheckpointTest, EveryTruncationAndEveryFlippedByteIsDetected) {
  const std::string bytes = EncodeCheckpoint(kLayout, Make(7));
  int undetected = 0;
  for (size_t n = 0; n < bytes.size(); n += 7) {
    if (DecodeCheckpoint(kLayout, bytes.substr(0, n)).ok()) ++undetected;
  }
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] ^= 0x10;
    auto d = DecodeCheckpoint(kLayout, bad);
    if (d.ok())
      ++undetected;
    else
      EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss) << i;
  }
  EXPECT_EQ(undetected, 0);
}

TEST(CheckpointTest, OtherModelIsRefused) {
  const std::string bytes = EncodeCheckpoint(kLayout, Make(1));
  auto d = DecodeCheckpoint(ModelLayout::Mlp({6, 4, 3}), bytes);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(CheckpointStoreTest, NewestValidIsLoadedAndCorruptOnesAreSkipped) {
  TempDir dir;
  CheckpointStore store(dir.path(), kLayout, 10);
  ASSERT_TRUE(store.Open().ok());
  for (int step : {10, 20, 30}) ASSERT_TRUE(store.Write(Make(step)).ok());
  // Truncate the newest, flip a byte in the one before.
  const std::string newest = dir.File(CheckpointFileName(30));
  const std::string middle = dir.File(CheckpointFileName(20));
  auto n = ReadFile(newest);
  ASSERT_TRUE(n.ok());
  ASSERT_TRUE(WriteFileAtomic(newest, n->substr(0, n->size() / 2)).ok());
  auto m = ReadFile(middle);
  ASSERT_TRUE(m.ok());
  (*m)[m->size() - 100] ^= 1;
  ASSERT_TRUE(WriteFileAtomic(middle, *m).ok());
  auto loaded = store.LoadNewest();
  ASSERT_TRUE(loaded.has_value());
  EXPECT_TRUE(SameState(loaded->state, Make(10).state));
}

TEST(CheckpointStoreTest, OnlyTheNewestKAreKept) {
  TempDir dir;
  CheckpointStore store(dir.path(), kLayout, 2);
  ASSERT_TRUE(store.Open().ok());
  for (int step = 1; step <= 5; ++step) store.WriteAsync(Make(step * 10), 0);
  store.Flush();
  ASSERT_TRUE(store.Write(Make(60)).ok());
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    names.push_back(e.path().filename());
  }
  std::sort(names.begin(), names.end());
  ASSERT_EQ(names.size(), 2u);
  EXPECT_EQ(names.back(), CheckpointFileName(60));
  EXPECT_EQ(store.failures(), 0);
}

// The steps of the checkpoint files in `dir`, oldest first.
std::vector<int64_t> StepsOnDisk(const std::string& dir) {
  CheckpointStore reopened(dir, kLayout, 100);
  EXPECT_TRUE(reopened.Open().ok());
  return reopened.RestorableSteps();
}

// The sequence: keep 3, steps 10..50 written, then step 10 again as
// after a rollback to step 0. Steps 30..50 belong to a history the job left;
// the new step 10 is the only checkpoint of the history it is in.
TEST(CheckpointStoreTest, AfterARollbackTheNewHistoryIsKeptNotTheAbandonedOne) {
  TempDir dir;
  CheckpointStore store(dir.path(), kLayout, 3);
  ASSERT_TRUE(store.Open().ok());
  for (int step = 10; step <= 50; step += 10) {
    ASSERT_TRUE(store.Write(Make(step)).ok());
  }
  ASSERT_TRUE(store.Write(Make(10)).ok());
  EXPECT_EQ(store.RestorableSteps(), std::vector<int64_t>{10});
  EXPECT_EQ(StepsOnDisk(dir.path()), std::vector<int64_t>{10});
  std::optional<Checkpoint> newest = store.LoadNewest();
  ASSERT_TRUE(newest.has_value());
  EXPECT_EQ(newest->state.step, 10);
  for (int step = 20; step <= 40; step += 10) store.WriteAsync(Make(step), 0);
  store.Flush();
  EXPECT_EQ(store.RestorableSteps(), (std::vector<int64_t>{20, 30, 40}));
}

// Rewind is the rollback itself, before any checkpoint of the new history
// exists: a restart then resumes at the restored step, not in the future
// the job left. A checkpoint of that future still waiting for the disk is
// not written.
TEST(CheckpointStoreTest, ARewindRemovesTheCheckpointsPastTheRestoredStep) {
  TempDir dir;
  CheckpointStore store(dir.path(), kLayout, 10);
  ASSERT_TRUE(store.Open().ok());
  for (int step = 10; step <= 50; step += 10) {
    ASSERT_TRUE(store.Write(Make(step)).ok());
  }
  // Written, being written or waiting when the rewind comes: all past it.
  for (int step = 60; step <= 80; step += 10) store.WriteAsync(Make(step), 0);
  store.Rewind(30, 1);
  store.Flush();
  EXPECT_EQ(store.RestorableSteps(), (std::vector<int64_t>{10, 20, 30}));
  EXPECT_EQ(StepsOnDisk(dir.path()), (std::vector<int64_t>{10, 20, 30}));
  std::optional<Checkpoint> newest = store.LoadNewest();
  ASSERT_TRUE(newest.has_value());
  EXPECT_EQ(newest->state.step, 30);
  store.Rewind(0, 2);
  EXPECT_EQ(store.RestorableSteps(), std::vector<int64_t>{});
  EXPECT_EQ(StepsOnDisk(dir.path()), std::vector<int64_t>{});
  EXPECT_FALSE(store.LoadNewest().has_value());
  EXPECT_EQ(store.failures(), 0);
}

// The checkpoint of a step of the abandoned history can reach the store
// just after the rewind (the coordinator hands it over outside its lock):
// it names the history it was taken in, and is not written. The new
// history's checkpoints are, even of the same step.
TEST(CheckpointStoreTest,
     ACheckpointOfTheAbandonedHistoryAfterTheRewindIsDropped) {
  TempDir dir;
  CheckpointStore store(dir.path(), kLayout, 10);
  ASSERT_TRUE(store.Open().ok());
  constexpr uint64_t kOld = 7, kNew = 8;
  for (int step = 10; step <= 30; step += 10)
    store.WriteAsync(Make(step), kOld);
  store.Flush();
  store.Rewind(10, kNew);
  store.WriteAsync(Make(40), kOld);
  store.Flush();
  EXPECT_EQ(StepsOnDisk(dir.path()), std::vector<int64_t>{10});
  EXPECT_EQ(store.RestorableSteps(), std::vector<int64_t>{10});
  store.WriteAsync(Make(20), kNew);
  store.Flush();
  EXPECT_EQ(StepsOnDisk(dir.path()), (std::vector<int64_t>{10, 20}));
  EXPECT_EQ(store.failures(), 0);
}

// Checkpoints handed in faster than the disk writes them are all written:
// none is replaced while it waits, so that every shard of a job holds the
// same steps.
TEST(CheckpointStoreTest, EveryCheckpointHandedInIsWritten) {
  TempDir dir;
  CheckpointStore store(dir.path(), kLayout, 10);
  ASSERT_TRUE(store.Open().ok());
  for (int step = 1; step <= 8; ++step) store.WriteAsync(Make(step * 10), 0);
  store.Flush();
  EXPECT_EQ(store.RestorableSteps(),
            (std::vector<int64_t>{10, 20, 30, 40, 50, 60, 70, 80}));
  EXPECT_EQ(store.failures(), 0);
}

TEST(CheckpointStoreTest, DirectoryThatIsAFileIsAClearError) {
  TempDir dir;
  ASSERT_TRUE(WriteFileAtomic(dir.File("file"), "x").ok());
  CheckpointStore store(dir.File("file"), kLayout, 2);
  absl::Status s = store.Open();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(dir.File("file")), std::string::npos) << s;
}

// Both writers' failures are counted (dp-ps exports the count), and the
// newest step stays at the last good checkpoint until the next one lands.
TEST(CheckpointStoreTest, FailedWriteKeepsThePreviousCheckpoints) {
  TempDir dir;
  CheckpointStore store(dir.path(), kLayout, 3);
  ASSERT_TRUE(store.Open().ok());
  ASSERT_TRUE(store.Write(Make(10)).ok());
  // A file-size limit smaller than a checkpoint makes the next writes fail
  // the way a full disk does, even for root.
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit old;
  getrlimit(RLIMIT_FSIZE, &old);
  struct rlimit tiny = old;
  tiny.rlim_cur = 64;
  setrlimit(RLIMIT_FSIZE, &tiny);
  absl::Status s = store.Write(Make(20));
  store.WriteAsync(Make(30), 0);
  store.Flush();
  setrlimit(RLIMIT_FSIZE, &old);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("step 20"), std::string::npos) << s;
  EXPECT_EQ(store.failures(), 2);
  EXPECT_EQ(store.NewestStep(), 10);
  auto loaded = store.LoadNewest();
  ASSERT_TRUE(loaded.has_value());
  EXPECT_TRUE(SameState(loaded->state, Make(10).state));
  store.WriteAsync(Make(40), 0);
  store.Flush();
  EXPECT_EQ(store.failures(), 2);
  EXPECT_EQ(store.NewestStep(), 40);
}

// What a restart would resume from: the newest checkpoint that verifies
// when the store opens (0 without one), then each one written, and the
// restored step after a rollback.
TEST(CheckpointStoreTest, NewestStepIsTheCheckpointARestartWouldResumeFrom) {
  TempDir dir;
  {
    CheckpointStore empty(dir.path(), kLayout, 3);
    ASSERT_TRUE(empty.Open().ok());
    EXPECT_EQ(empty.NewestStep(), 0);
    for (int step : {10, 20, 30}) ASSERT_TRUE(empty.Write(Make(step)).ok());
    EXPECT_EQ(empty.NewestStep(), 30);
  }
  // A corrupt newest file is not what a restart resumes from.
  const std::string newest = dir.File(CheckpointFileName(30));
  auto bytes = ReadFile(newest);
  ASSERT_TRUE(bytes.ok());
  ASSERT_TRUE(WriteFileAtomic(newest, bytes->substr(0, 100)).ok());
  CheckpointStore store(dir.path(), kLayout, 3);
  ASSERT_TRUE(store.Open().ok());
  EXPECT_EQ(store.NewestStep(), 20);
  std::optional<Checkpoint> loaded = store.LoadNewest();
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->state.step, 20);
  store.Rewind(10, 1);
  EXPECT_EQ(store.NewestStep(), 10);
  EXPECT_EQ(store.failures(), 0);
}

// Names left in `dir` that are not checkpoints: a write that collided with
// another leaves its temporary file behind.
std::vector<std::string> Strays(const std::string& dir) {
  std::vector<std::string> strays;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename();
    if (name.rfind("ckpt-", 0) != 0 || name.find(".tmp") != std::string::npos) {
      strays.push_back(name);
    }
  }
  return strays;
}

// The last step's checkpoint hook (WriteAsync) can still be in flight when
// the final checkpoint (Write) of the same step starts: both must succeed
// and leave one valid file.
TEST(CheckpointStoreTest, ConcurrentWritesOfOneStepAllSucceed) {
  TempDir dir;
  CheckpointStore store(dir.path(), kLayout, 2);
  ASSERT_TRUE(store.Open().ok());
  constexpr int kThreads = 4;
  constexpr int kWrites = 50;
  std::vector<absl::Status> errors[kThreads];
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kWrites; ++i) {
        // Steps 100 and 101 alternate, so retention runs concurrently too.
        if (t == 0) store.WriteAsync(Make(100 + i % 2), 0);
        absl::Status s = store.Write(Make(100 + i % 2));
        if (!s.ok()) errors[t].push_back(s);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  store.Flush();
  int failed = 0;
  for (const auto& e : errors) {
    failed += e.size();
    if (!e.empty()) ADD_FAILURE() << "first error: " << e.front();
  }
  EXPECT_EQ(failed, 0) << "of " << kThreads * kWrites << " writes";
  EXPECT_EQ(store.failures(), 0);
  EXPECT_TRUE(Strays(dir.path()).empty())
      << "left behind: " << Strays(dir.path()).front();
  auto loaded = store.LoadNewest();
  ASSERT_TRUE(loaded.has_value());
  EXPECT_TRUE(SameState(loaded->state, Make(101).state));
}

// The same for any file: concurrent atomic writes of one path each leave
// the whole of one of the contents, never an error or a mix.
TEST(FileUtilTest, ConcurrentAtomicWritesOfOnePathAllSucceed) {
  TempDir dir;
  const std::string path = dir.File("f");
  constexpr int kThreads = 4;
  const std::string contents[kThreads] = {
      std::string(100000, 'a'), std::string(100001, 'b'),
      std::string(100002, 'c'), std::string(100003, 'd')};
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        if (!WriteFileAtomic(path, contents[t]).ok()) ++failed;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failed.load(), 0);
  auto back = ReadFile(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(std::find(std::begin(contents), std::end(contents), *back) !=
              std::end(contents))
      << "a mix of " << back->size() << " bytes";
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    ++files;
    (void)e;
  }
  EXPECT_EQ(files, 1) << "temporary files left behind";
}

TEST(JobConfigTest, ResumeRefusesOtherHyperParametersButAllowsMoreEpochs) {
  JobConfig a = Make(1).config;
  JobConfig b = a;
  b.schedule.epochs = 9;
  b.schedule.max_steps = 1234;
  EXPECT_TRUE(CheckResumable(a, b).ok());
  b.schedule.batch_size = 16;  // 2 micro-batches of 16: 32 a step
  b.adam.lr = 0.5;
  b.weight_encoding = Encoding::kBf16;
  absl::Status s = CheckResumable(a, b);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("--global_batch=32 (saved: 16)"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("--micro_batch=16 (saved: 8)"), std::string::npos)
      << s;
  EXPECT_NE(s.message().find("--lr=0.5"), std::string::npos) << s;
  EXPECT_NE(s.message().find("--weight_encoding=bf16 (saved: f32)"),
            std::string::npos)
      << s;
}

// A job with every optimiser setting off its default.
AdamOptions TunedOptimiser() {
  AdamOptions o;
  o.lr = 3e-3;
  o.beta1 = 0.8;
  o.beta2 = 0.99;
  o.eps = 1e-6;
  o.weight_decay = 0.05;
  o.decoupled_weight_decay = true;
  o.schedule.kind = LrScheduleKind::kStep;
  o.schedule.warmup_steps = 7;
  o.schedule.lr_min = 1e-5;
  o.schedule.step_every = 11;
  o.schedule.gamma = 0.5;
  o.clip_grad_norm = 2.5;
  return o;
}

TEST(CheckpointTest, TheOptimiserSettingsRoundTrip) {
  Checkpoint c = Make(3);
  c.config.adam = TunedOptimiser();
  auto back = DecodeCheckpoint(kLayout, EncodeCheckpoint(kLayout, c));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->config.adam == c.config.adam);
  EXPECT_TRUE(CheckResumable(c.config, back->config).ok());
}

// One of a later version's schedules would run here as another: refused.
TEST(CheckpointTest, AnUnknownLearningRateScheduleIsRefused) {
  Checkpoint c = Make(2);
  c.config.adam.schedule.kind = static_cast<LrScheduleKind>(7);
  auto back = DecodeCheckpoint(kLayout, EncodeCheckpoint(kLayout, c));
  EXPECT_EQ(back.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(back.status().message().find("learning-rate schedule 7"),
            std::string::npos)
      << back.status();
}

// A checkpoint written before the optimiser settings existed has none: it
// was today's Adam, and resumes as that job.
TEST(CheckpointTest, AConfigWithoutOptimiserSettingsIsTodaysAdam) {
  dp::v1::JobConfig proto;
  proto.set_lr(2e-3);
  AdamOptions want;
  want.lr = 2e-3;
  EXPECT_TRUE(FromProto(proto).adam == want);
}

TEST(JobConfigTest, ResumeRefusesOtherOptimiserSettingsUnlessAllowed) {
  const JobConfig a = Make(1).config;
  JobConfig b = a;
  // The schedule's own settings count only where a schedule reads them.
  b.adam.schedule.gamma = 0.5;
  b.adam.schedule.lr_min = 1e-5;
  EXPECT_TRUE(CheckResumable(a, b).ok()) << CheckResumable(a, b);
  b.adam = TunedOptimiser();
  absl::Status s = CheckResumable(a, b);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "the checkpoint was written with other optimiser settings: "
            "--optimizer=adamw (saved: adam), --lr=0.003 (saved: 0.001), "
            "--beta1=0.8 (saved: 0.9), --beta2=0.99 (saved: 0.999), "
            "--eps=1e-06 (saved: 1e-08), --weight_decay=0.05 (saved: 0), "
            "--lr_schedule=step (saved: constant), --warmup_steps=7 (saved: "
            "0), --lr_step_every=11 (saved: 0), --lr_gamma=0.5 (saved: 0.1), "
            "--clip_grad_norm=2.5 (saved: 0) (--allow_hyperparameter_change "
            "resumes with the new ones)");
  EXPECT_TRUE(CheckResumable(a, b, /*allow_hyperparameter_change=*/true).ok());
  EXPECT_EQ(HyperparameterChanges(a, b).size(), 11u);
  // Allowed, they are still no licence for another job; refused, they are
  // listed after its differences.
  b.schedule.seed = 9;
  s = CheckResumable(a, b, /*allow_hyperparameter_change=*/true);
  EXPECT_EQ(s.message(),
            "the checkpoint was written by a different job: --seed=9 (saved: "
            "0)");
  s = CheckResumable(a, b);
  EXPECT_NE(s.message().find("different job: --seed=9 (saved: 0), "
                             "--optimizer=adamw (saved: adam)"),
            std::string::npos)
      << s;
}

// A cosine schedule spans the job: another number of steps is another rate
// at every step to come, once the data set's length says how many steps.
TEST(JobConfigTest, ACosineJobOfAnotherLengthIsAnOptimiserChange) {
  JobConfig a = Make(1).config;  // a step: 2 micro-batches of 8
  a.adam.schedule.kind = LrScheduleKind::kCosine;
  a.schedule.max_steps = 50;
  JobConfig b = a;
  b.schedule.max_steps = 60;
  EXPECT_TRUE(HyperparameterChanges(a, b).empty()) << "length unknown";
  a.schedule.num_samples = b.schedule.num_samples = 1000;  // 62 steps/epoch
  EXPECT_EQ(HyperparameterChanges(a, b),
            std::vector<std::string>{"--epochs/--max_steps: the cosine "
                                     "schedule's total steps=60 (saved: 50)"});
  // More epochs that --max_steps caps anyway change nothing.
  b.schedule.max_steps = 50;
  b.schedule.epochs = 4;
  EXPECT_TRUE(HyperparameterChanges(a, b).empty());
  // Nor does any length for a constant rate.
  a.adam.schedule.kind = b.adam.schedule.kind = LrScheduleKind::kConstant;
  b.schedule.max_steps = 0;
  EXPECT_TRUE(HyperparameterChanges(a, b).empty());
}

// The step is what a checkpoint pins: its global batch and micro-batch size,
// not how many workers compute it or how many must be live.
TEST(JobConfigTest, ResumeAllowsOtherWorkersButNotAnotherSplitOfTheStep) {
  JobConfig a = Make(1).config;  // 2 workers, one micro-batch of 8 each
  JobConfig b = a;
  b.schedule.world_size = 5;
  b.schedule.micro_batches = 2;
  b.min_workers = 3;
  EXPECT_TRUE(CheckResumable(a, b).ok()) << CheckResumable(a, b);
  // The same 16 samples a step in 4 micro-batches of 4.
  b.schedule.batch_size = 4;
  b.schedule.micro_batches = 4;
  absl::Status s = CheckResumable(a, b);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "the checkpoint was written by a different job: --micro_batch=4 "
            "(saved: 8)");
}

}  // namespace
}  // namespace dp
