// A whole dp-ps in-process (PsServer) with in-process trainers: a job runs
// to its end, Stop drains it from another thread at any moment, and the
// server outlives nothing it started.
#include "server/ps_server.h"

#include <signal.h>

#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "proto/dp.grpc.pb.h"
#include "proto/grpc_server.h"
#include "proto/grpc_status.h"
#include "server/shard_gather.h"
#include "tests/job_runner.h"
#include "tests/raw_client.h"
#include "tests/subprocess.h"
#include "worker/ps_group.h"
#include "worker/trainer.h"

namespace dp {
namespace {

PsServerOptions SyntheticJob(int workers, int64_t max_steps) {
  PsServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.config.schedule.world_size = workers;
  o.config.schedule.batch_size = 8;
  o.config.schedule.max_steps = max_steps;
  o.config.schedule.seed = 5;
  o.config.dataset = "synthetic";
  o.final_eval_timeout = absl::Seconds(30);
  o.update_threads = 1;
  return o;
}

// Runs rank `rank` of the job served by `server` to its end.
absl::Status Train(const PsServer& server, int rank) {
  PsClientOptions client_options;
  client_options.address = absl::StrCat("127.0.0.1:", server.port());
  client_options.max_message_bytes =
      MessageBytesFor(ModelLayout::SimpleNet().num_params());
  client_options.retry_for = absl::Seconds(1);
  PsGroup client({client_options.address}, client_options);
  TrainerOptions options;
  options.rank = rank;
  Trainer trainer(&client, options);
  return trainer.Run();
}

TEST(PsServerTest, TheDefaultUpdateThreadsGrowWithTheModelNotTheMachine) {
  // SimpleNet (and any shard of it) is updated on one thread however many
  // cores there are: waking a second costs more than it saves.
  const int64_t simple_net = ModelLayout::SimpleNet().num_params();
  EXPECT_EQ(DefaultUpdateThreads(simple_net, 64), 1);
  EXPECT_EQ(DefaultUpdateThreads(simple_net / 2, 64), 1);
  EXPECT_EQ(DefaultUpdateThreads(kValuesPerUpdateThread, 64), 1);
  EXPECT_EQ(DefaultUpdateThreads(kValuesPerUpdateThread + 1, 64), 2);
  // Never more than the CPUs this process may use, nor than the cap.
  EXPECT_EQ(DefaultUpdateThreads(10 * kValuesPerUpdateThread, 2), 2);
  EXPECT_EQ(DefaultUpdateThreads(10 * kValuesPerUpdateThread, 64),
            kMaxUpdateThreads);
  EXPECT_EQ(DefaultUpdateThreads(10 * kValuesPerUpdateThread, 0), 1);
}

TEST(PsServerTest, AJobRunsToItsEndAndSavesTheModel) {
  TempDir dir;
  PsServerOptions o = SyntheticJob(2, 6);
  o.save_model = dir.File("model.safetensors");
  o.checkpoint_dir = dir.File("ckpt");
  o.checkpoint_every = 2;
  auto server = PsServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status();
  absl::Status w0, w1;
  std::thread t0([&] { w0 = Train(**server, 0); });
  std::thread t1([&] { w1 = Train(**server, 1); });
  const absl::StatusOr<PsServer::Outcome> outcome = (*server)->Run();
  t0.join();
  t1.join();
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(*outcome, PsServer::Outcome::kFinished);
  EXPECT_TRUE(w0.ok()) << w0;
  EXPECT_TRUE(w1.ok()) << w1;
  EXPECT_EQ((*server)->coordinator().Status().step, 6);
  // The model is the final weights; the newest checkpoint is of the end.
  const auto saved = LoadSafetensors(o.save_model, ModelLayout::SimpleNet());
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_TRUE(*saved == (*server)->coordinator().Snapshot().params);
  CheckpointStore store(o.checkpoint_dir, ModelLayout::SimpleNet(), 3);
  ASSERT_TRUE(store.Open().ok());
  const std::optional<Checkpoint> newest = store.LoadNewest();
  ASSERT_TRUE(newest.has_value());
  EXPECT_EQ(newest->state.step, 6);
  EXPECT_TRUE(newest->state.params == *saved);
}

TEST(PsServerTest, StopBeforeTheEndCheckpointsAndReturnsStopped) {
  TempDir dir;
  PsServerOptions o = SyntheticJob(1, 1000000);
  o.checkpoint_dir = dir.File("ckpt");
  o.checkpoint_every = 0;  // only the final one
  auto server = PsServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status();
  PsServer* s = server->get();
  absl::StatusOr<PsServer::Outcome> outcome;
  std::thread run([&] { outcome = s->Run(); });
  // The worker trains until the stop refuses its steps.
  std::thread stopper([s] {
    while (s->coordinator().Status().step < 5)
      absl::SleepFor(absl::Milliseconds(5));
    s->Stop(SIGTERM);
  });
  const absl::Status trained = Train(*s, 0);
  stopper.join();
  run.join();
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(*outcome, PsServer::Outcome::kStopped);
  EXPECT_FALSE(trained.ok());  // refused (UNAVAILABLE), not finished
  CheckpointStore store(o.checkpoint_dir, ModelLayout::SimpleNet(), 3);
  ASSERT_TRUE(store.Open().ok());
  auto newest = store.LoadNewest();
  ASSERT_TRUE(newest.has_value());
  EXPECT_EQ(newest->state.step, s->coordinator().Status().step);
  EXPECT_GE(newest->state.step, 5);
}

// What a signal watcher does when a signal arrives while dp-ps finishes:
// Stop from another thread while Run returns, repeatedly, then destroy.
// (Under AddressSanitizer a touch of anything already gone fails it.)
TEST(PsServerTest, StopRacingTheEndOfRunIsSafe) {
  for (int round = 0; round < 5; ++round) {
    auto server = PsServer::Start(SyntheticJob(1, 3));
    ASSERT_TRUE(server.ok()) << server.status();
    PsServer* s = server->get();
    absl::StatusOr<PsServer::Outcome> outcome;
    std::thread run([&] { outcome = s->Run(); });
    std::thread stopper([s] {
      while (s->coordinator().Status().step < 3)
        absl::SleepFor(absl::Milliseconds(1));
      for (int i = 0; i < 100; ++i) s->Stop(SIGTERM);
    });
    (void)Train(*s, 0);
    stopper.join();
    run.join();
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    // Every step was applied before the stop: the job counts as finished.
    EXPECT_EQ(*outcome, PsServer::Outcome::kFinished);
    s->Stop(SIGTERM);  // after Run, before destruction: allowed
    server->reset();
  }
}

TEST(PsServerTest, ABusyPortIsUnavailableAndACheckpointOfAnotherJobIsRefused) {
  auto first = PsServer::Start(SyntheticJob(1, 3));
  ASSERT_TRUE(first.ok()) << first.status();
  PsServerOptions o = SyntheticJob(1, 3);
  o.port = (*first)->port();
  auto second = PsServer::Start(o);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);

  TempDir dir;
  PsServerOptions saved = SyntheticJob(1, 3);
  saved.checkpoint_dir = dir.File("ckpt");
  {
    auto server = PsServer::Start(saved);
    ASSERT_TRUE(server.ok()) << server.status();
    absl::Status w;
    std::thread t([&] { w = Train(**server, 0); });
    ASSERT_TRUE((*server)->Run().ok());
    t.join();
  }
  saved.config.schedule.batch_size = 16;
  auto other = PsServer::Start(saved);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(other.status().message().find("--micro_batch=16 (saved: 8)"),
            std::string::npos)
      << other.status();
}

TEST(PsServerTest, ACheckpointOfAnotherShardIsRefusedNamingBoth) {
  TempDir dir;
  PsServerOptions o = SyntheticJob(1, 3);
  o.checkpoint_dir = dir.File("ckpt");
  o.shards = 2;
  o.shard = 1;
  {
    auto server = PsServer::Start(o);
    ASSERT_TRUE(server.ok()) << server.status();
    (*server)->Stop(SIGTERM);
    ASSERT_TRUE((*server)->Run().ok());  // writes the checkpoint of step 0
  }
  for (auto [shards, shard] :
       std::vector<std::pair<int, int>>{{2, 0}, {1, 0}}) {
    o.shards = shards;
    o.shard = shard;
    o.gather.addresses = {"127.0.0.1:1"};
    auto other = PsServer::Start(o);
    ASSERT_FALSE(other.ok());
    EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(
        other.status().message().find(absl::StrCat(
            "holds shard 1 of 2; this dp-ps is shard ", shard, " of ", shards)),
        std::string::npos)
        << other.status();
  }
}

// Rollback over gRPC, as PsGroup::Register calls it.
class ShardRollback {
 public:
  explicit ShardRollback(int port) : stub_(ConnectRaw(port)) {}
  absl::Status Rollback(int64_t step, uint64_t generation,
                        dp::v1::RollbackResponse* response = nullptr) {
    grpc::ClientContext ctx;
    dp::v1::RollbackRequest request;
    request.set_step(step);
    request.set_generation(generation);
    dp::v1::RollbackResponse ignored;
    return FromGrpcStatus(stub_->Rollback(
        &ctx, request, response != nullptr ? response : &ignored));
  }
  // What shard 0 says once it has this shard's final weights of `step`.
  void Collected(int64_t step) {
    grpc::ClientContext ctx;
    dp::v1::GetStatusRequest request;
    request.set_collected(step);
    dp::v1::GetStatusResponse status;
    EXPECT_TRUE(stub_->GetStatus(&ctx, request, &status).ok());
  }
  dp::v1::GetStatusResponse Status() {
    grpc::ClientContext ctx;
    dp::v1::GetStatusResponse status;
    EXPECT_TRUE(stub_->GetStatus(&ctx, {}, &status).ok());
    return status;
  }

 private:
  std::unique_ptr<dp::v1::ParameterServer::Stub> stub_;
};

// The data every in-process shard's job trains on.
const DataFingerprint kShardData{1000, 0x5eed};

// Applies the steps of a one-worker job up to `to` on one shard, as rank 0
// pushing zero gradients (every shard's update is its own: the others need
// not be there).
void TrainShard(StepCoordinator& c, int64_t to) {
  const ParamRange range = c.shard().range;
  ASSERT_TRUE(c.Register(0, c.layout().Fingerprint(), kShardData).ok());
  const std::string zeros(range.length * sizeof(float), '\0');
  for (int64_t step = c.Status().step; step < to; ++step) {
    const auto pushed = c.Push(0, step, range.offset, zeros, 1.0f);
    ASSERT_TRUE(pushed.ok()) << pushed.status();
  }
}

// Shard 1 of 2 of job `o` with checkpoints of `steps` in o.checkpoint_dir,
// as if it had trained to the last of them.
void WriteShardCheckpoints(const PsServerOptions& o,
                           const std::vector<int64_t>& steps) {
  const ModelLayout layout = ModelLayout::SimpleNet();
  ShardSpec spec;
  ASSERT_TRUE(MakeShardSpec(layout, o.shards, o.shard, &spec).ok());
  CheckpointStore store(o.checkpoint_dir, layout, 100, o.shard, o.shards);
  ASSERT_TRUE(store.Open().ok());
  for (int64_t step : steps) {
    Checkpoint c{o.config, kShardData, {}, o.shard, o.shards};
    c.state.step = step;
    c.state.params.assign(spec.range.length, 0.5f * step);
    c.state.m.assign(spec.range.length, 0.0f);
    c.state.v.assign(spec.range.length, 0.0f);
    ASSERT_TRUE(store.Write(c).ok());
  }
}

PsServerOptions ShardOfTwo(const TempDir& dir, int shard = 1,
                           int64_t max_steps = 100) {
  PsServerOptions o = SyntheticJob(1, max_steps);
  o.shards = 2;
  o.shard = shard;
  o.checkpoint_dir = dir.File(absl::StrCat("ckpt", shard));
  o.checkpoint_every = 1000;  // only the ones the test writes, and the last
  return o;
}

// Run() in a thread; `returned` once it has.
struct Running {
  explicit Running(PsServer* server)
      : thread([this, server] {
          outcome = server->Run();
          returned.Notify();
        }) {}
  ~Running() { thread.join(); }
  absl::StatusOr<PsServer::Outcome> outcome;
  absl::Notification returned;
  std::thread thread;
};

// Rollback over gRPC: refused without a change when decided on another
// generation or towards a step the shard cannot restore; done when decided
// on the shard's generation; UNIMPLEMENTED on a dp-ps that is not a shard.
TEST(PsServerTest, RollbackIsRefusedUnlessTheShardCanDoItAsDecided) {
  TempDir dir;
  const PsServerOptions o = ShardOfTwo(dir);
  WriteShardCheckpoints(o, {10, 20, 30});
  auto shard = PsServer::Start(o);
  ASSERT_TRUE(shard.ok()) << shard.status();
  ShardRollback client((*shard)->port());
  const dp::v1::GetStatusResponse status = client.Status();
  EXPECT_EQ(status.shard().index(), 1);
  EXPECT_EQ(status.shard().count(), 2);
  EXPECT_EQ(status.shard().offset() + status.shard().length(),
            ModelLayout::SimpleNet().num_params());
  EXPECT_EQ(status.step(), 30);
  const uint64_t generation = status.shard().generation();
  ASSERT_NE(generation, 0u);
  dp::v1::RollbackResponse response;
  // No checkpoint of step 7; a step out of range; another generation.
  EXPECT_EQ(client.Rollback(7, generation).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(client.Rollback(-1, generation).code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status stale = client.Rollback(20, generation + 1);
  EXPECT_EQ(stale.code(), absl::StatusCode::kAborted) << stale;
  EXPECT_EQ(client.Status().step(), 30);
  EXPECT_EQ(client.Status().shard().generation(), generation);
  // Decided on the shard's generation: done, and a new generation.
  const absl::Status done = client.Rollback(20, generation, &response);
  ASSERT_TRUE(done.ok()) << done;
  EXPECT_EQ(response.step(), 20);
  EXPECT_NE(response.shard().generation(), generation);
  EXPECT_EQ(client.Status().step(), 20);
  // At the step already: nothing to do, whatever the generation.
  const uint64_t now = response.shard().generation();
  ASSERT_TRUE(client.Rollback(20, now + 1, &response).ok());
  EXPECT_EQ(response.step(), 20);
  EXPECT_EQ(response.shard().generation(), now);
  (*shard)->Stop(SIGTERM);
  EXPECT_TRUE((*shard)->Run().ok());

  auto single = PsServer::Start(SyntheticJob(1, 3));
  ASSERT_TRUE(single.ok()) << single.status();
  EXPECT_EQ(ShardRollback((*single)->port()).Rollback(0, 1).code(),
            absl::StatusCode::kUnimplemented);
}

// After a rollback the checkpoints past the restored step belong to no
// history: the shard no longer offers them, and restarted (before it wrote
// another checkpoint) it resumes at the restored step, not in the future
// the job left.
TEST(PsServerTest, ARolledBackShardRestartsAtTheRestoredStep) {
  TempDir dir;
  const PsServerOptions o = ShardOfTwo(dir);
  WriteShardCheckpoints(o, {10, 20, 30, 40, 50});
  {
    auto shard = PsServer::Start(o);
    ASSERT_TRUE(shard.ok()) << shard.status();
    ShardRollback client((*shard)->port());
    const dp::v1::GetStatusResponse before = client.Status();
    ASSERT_EQ(before.step(), 50);
    const absl::Status rolled =
        client.Rollback(30, before.shard().generation());
    ASSERT_TRUE(rolled.ok()) << rolled;
    const dp::v1::GetStatusResponse after = client.Status();
    EXPECT_EQ(std::vector<int64_t>(after.shard().restorable_steps().begin(),
                                   after.shard().restorable_steps().end()),
              (std::vector<int64_t>{0, 10, 20, 30}));
    // Gone without Run's final checkpoint, as if killed: what it left on
    // disk decides where it resumes.
  }
  auto restarted = PsServer::Start(o);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  EXPECT_EQ((*restarted)->coordinator().Status().step, 30);
  (*restarted)->Stop(SIGTERM);
  EXPECT_TRUE((*restarted)->Run().ok());
}

// The shards disagree on who pushed step 0 (a worker killed between its
// pushes to the two): a waiting worker is told every rank that any shard
// still lacks, not only shard 0's.
TEST(PsServerTest, TheRanksAWorkerWaitsForAreThoseAnyShardLacks) {
  TempDir dir;
  std::vector<std::unique_ptr<PsServer>> shards;
  for (int k : {1, 0}) {
    PsServerOptions o = ShardOfTwo(dir, k, 30);
    o.config.schedule.world_size = 3;
    o.checkpoint_dir.clear();
    if (k == 0) {
      o.gather.addresses = {absl::StrCat("127.0.0.1:", shards[0]->port())};
    }
    auto shard = PsServer::Start(o);
    ASSERT_TRUE(shard.ok()) << shard.status();
    shards.insert(shards.begin(), *std::move(shard));
  }
  // Shard 0 has the pushes of ranks 0 and 1, shard 1 only rank 0's.
  for (int k : {0, 1}) {
    StepCoordinator& c = shards[k]->coordinator();
    const ParamRange range = c.shard().range;
    const std::string zeros(range.length * sizeof(float), '\0');
    for (int rank = 0; rank < 3; ++rank) {
      ASSERT_TRUE(c.Register(rank, c.layout().Fingerprint(), kShardData).ok());
    }
    for (int rank : k == 0 ? std::vector<int>{0, 1} : std::vector<int>{0}) {
      ASSERT_TRUE(c.Push(rank, 0, range.offset, zeros, 1.0f).ok());
    }
  }
  PsClientOptions options;
  options.retry_for = absl::Seconds(1);
  PsGroup group({absl::StrCat("127.0.0.1:", shards[0]->port()),
                 absl::StrCat("127.0.0.1:", shards[1]->port())},
                options);
  const absl::StatusOr<std::vector<int>> lacking = group.Unpushed(0, 3);
  ASSERT_TRUE(lacking.ok()) << lacking.status();
  EXPECT_EQ(*lacking, (std::vector<int>{1, 2}));
  for (auto& shard : shards) shard->Stop(SIGTERM);
}

// A shard collected at the end, then rolled back (another shard restarted
// from an older checkpoint) reaches the end again: it serves until shard 0
// has collected that end too, not only the first.
TEST(PsServerTest, AShardRolledBackAfterItsCollectionServesTheNewEnd) {
  TempDir dir;
  PsServerOptions o = ShardOfTwo(dir, 1, 30);
  WriteShardCheckpoints(o, {20, 30});
  auto shard = PsServer::Start(o);
  ASSERT_TRUE(shard.ok()) << shard.status();
  ASSERT_TRUE((*shard)->coordinator().done());
  ShardRollback client((*shard)->port());
  client.Collected(30);
  const absl::Status rolled =
      client.Rollback(20, client.Status().shard().generation());
  ASSERT_TRUE(rolled.ok()) << rolled;
  Running run(shard->get());
  TrainShard((*shard)->coordinator(), 30);
  // The checkpoint of step 30 went with the rollback; Finish writes it.
  ASSERT_TRUE(WaitForFile(o.checkpoint_dir + "/" + CheckpointFileName(30),
                          absl::Seconds(30)));
  EXPECT_FALSE(run.returned.WaitForNotificationWithTimeout(absl::Seconds(1)))
      << "the shard ended before shard 0 collected its new end";
  GatherOptions gather;
  gather.addresses = {absl::StrCat("127.0.0.1:", (*shard)->port())};
  gather.timeout = absl::Seconds(10);
  const ParamRange own = ShardRanges(ModelLayout::SimpleNet(), 2)[0];
  const auto all = GatherShards(gather, ModelLayout::SimpleNet(), 2, 30, 0,
                                std::vector<float>(own.length, 0.0f));
  EXPECT_TRUE(all.ok()) << all.status();
  ASSERT_TRUE(run.returned.WaitForNotificationWithTimeout(absl::Seconds(30)));
  ASSERT_TRUE(run.outcome.ok()) << run.outcome.status();
  EXPECT_EQ(*run.outcome, PsServer::Outcome::kFinished);
}

// The last step half applied: shard 0 is at the end, shard 1 waits for a
// worker that comes back later than --final_eval_timeout_s. Shard 0 waits
// for it (shard 1 answers all along) and saves the model.
TEST(PsServerTest, Shard0SavesTheModelWhenAWorkerIsLateForTheLastStep) {
  TempDir dir;
  PsServerOptions o1 = ShardOfTwo(dir, 1, 30);
  // Shard 1 waits to be collected at most this long, and returns as soon as
  // it is: long, so that shard 0's collection lands however slow it is.
  o1.final_eval_timeout = absl::Minutes(2);
  WriteShardCheckpoints(o1, {29});
  auto shard1 = PsServer::Start(o1);
  ASSERT_TRUE(shard1.ok()) << shard1.status();
  PsServerOptions o0 = ShardOfTwo(dir, 0, 30);
  o0.final_eval_timeout = absl::Seconds(1);
  o0.save_model = dir.File("model.safetensors");
  o0.gather.addresses = {absl::StrCat("127.0.0.1:", (*shard1)->port())};
  WriteShardCheckpoints(o0, {30});
  auto shard0 = PsServer::Start(o0);
  ASSERT_TRUE(shard0.ok()) << shard0.status();
  Running run0(shard0->get());
  Running run1(shard1->get());
  // The worker is away for more than twice --final_eval_timeout_s.
  EXPECT_FALSE(run0.returned.WaitForNotificationWithTimeout(absl::Seconds(3)))
      << (run0.outcome.ok() ? "" : run0.outcome.status().ToString());
  TrainShard((*shard1)->coordinator(), 30);
  ASSERT_TRUE(run0.returned.WaitForNotificationWithTimeout(absl::Seconds(30)));
  ASSERT_TRUE(run0.outcome.ok()) << run0.outcome.status();
  EXPECT_EQ(*run0.outcome, PsServer::Outcome::kFinished);
  const auto saved = LoadSafetensors(o0.save_model, ModelLayout::SimpleNet());
  ASSERT_TRUE(saved.ok()) << saved.status();
  const ParamRange r1 = ShardRanges(ModelLayout::SimpleNet(), 2)[1];
  EXPECT_EQ((*saved)[r1.offset], 0.5f * 29);  // shard 1's, zero gradients
  ASSERT_TRUE(run1.returned.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(run1.outcome.ok()) << run1.outcome.status();
}

}  // namespace
}  // namespace dp
