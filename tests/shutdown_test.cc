// dp-ps and dp-worker as Kubernetes runs them, with real processes over
// loopback gRPC: readiness and liveness (grpc.health.v1), SIGTERM during
// training, --exit_when_done=false, and --dry_run.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/flags.h"
#include "gtest/gtest.h"
#include "proto/dp.grpc.pb.h"
#include "proto/grpc_server.h"
#include "server/checkpoint.h"
#include "tests/health_client.h"
#include "tests/job_runner.h"
#include "tests/subprocess.h"

namespace dp {
namespace {

const absl::Duration kStartTimeout = absl::Seconds(60);
// The pods' terminationGracePeriodSeconds in deploy/k8s (dp-ps 60 s,
// workers 30 s): what "in time" means to Kubernetes. A drain's own work
// (2 s grace, a checkpoint, under AddressSanitizer the leak check) fits
// many times over on any machine; a drain that hangs does not.
const absl::Duration kStopDeadline = absl::Seconds(30);

// A job far longer than any test: stopping it is the point.
const std::vector<std::string> kLongJob = {"--dataset=synthetic",
                                           "--batch_size=8", "--epochs=100000"};

std::string Address(int port) { return absl::StrCat("127.0.0.1:", port); }

// The integer after `prefix` in the process's output.
int64_t IntField(const Subprocess& p, const std::string& prefix) {
  auto field = p.Field(prefix);
  int64_t value = -1;
  if (field.has_value()) {
    const std::string digits = field->substr(0, field->find_first_of(" ;,"));
    EXPECT_TRUE(absl::SimpleAtoi(digits, &value)) << *field;
  }
  return value;
}

dp::v1::GetStatusResponse GetStatus(int port) {
  auto stub = dp::v1::ParameterServer::NewStub(
      grpc::CreateChannel(Address(port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  dp::v1::GetStatusResponse response;
  grpc::Status s = stub->GetStatus(&context, {}, &response);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return response;
}

HealthStatus Health(const std::string& address, const std::string& service) {
  auto status = CheckHealth(address, service);
  EXPECT_TRUE(status.ok()) << status.status();
  return status.value_or(HealthStatus{});
}

TEST(ShutdownTest, DpPsOnSigtermTurnsNotServingAndExitsInterruptedInTime) {
  int port = 0;
  TempDir dir;
  std::vector<std::string> args = kLongJob;
  args.push_back("--workers=2");
  args.push_back("--checkpoint_dir=" + dir.File("ckpt"));
  auto ps = StartServer(args, &port);
  ASSERT_GT(port, 0);
  HealthWatcher readiness(Address(port), "");
  auto w0 = StartWorker(port, 0, {"--retry_for_s=1"});
  auto w1 = StartWorker(port, 1, {"--retry_for_s=1"});
  // Steps are being applied. (Not dp-ps's progress line: the first is
  // printed at step 0, once one worker has registered.)
  ASSERT_TRUE(WaitForStep(port, 1, kStartTimeout)) << ps->output();
  ASSERT_TRUE(readiness.WaitFor(kServing, kStopDeadline));
  EXPECT_EQ(Health(Address(port), kLivenessService), kServing);

  const absl::Time signalled = absl::Now();
  ps->Signal(SIGTERM);
  EXPECT_TRUE(readiness.WaitFor(kNotServing, kStopDeadline));
  EXPECT_EQ(ps->Wait(kStopDeadline), kExitInterrupted) << ps->output();
  EXPECT_LT(absl::Now() - signalled, kStopDeadline);
  const int64_t stopped_at = IntField(*ps, "stopped by signal 15 at step ");
  EXPECT_GT(stopped_at, 0) << ps->output();
  // The checkpoint written while draining loads and holds that step.
  CheckpointStore store(dir.File("ckpt"), ModelLayout::SimpleNet(), 3);
  const std::optional<Checkpoint> saved = store.LoadNewest();
  ASSERT_TRUE(saved.has_value()) << ps->output();
  EXPECT_EQ(saved->state.step, stopped_at);
  // Never SERVING again once draining began.
  const std::vector<HealthStatus> seen = readiness.statuses();
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.front(), kServing);
  EXPECT_EQ(seen.back(), kNotServing);
  // The workers find dp-ps gone and give up after --retry_for_s; neither
  // claims to have finished.
  EXPECT_NE(w0->Wait(kStopDeadline + absl::Seconds(30)), 0) << w0->output();
  EXPECT_NE(w1->Wait(kStopDeadline + absl::Seconds(30)), 0) << w1->output();
}

TEST(ShutdownTest, WorkerOnSigtermFinishesItsCurrentStepAndExitsInterrupted) {
  int port = 0;
  std::vector<std::string> args = kLongJob;
  args.push_back("--workers=1");
  auto ps = StartServer(args, &port);
  ASSERT_GT(port, 0);
  auto worker = StartWorker(port, 0, {"--health_port=0"});
  ASSERT_TRUE(worker->WaitForOutput("joined at step", kStartTimeout))
      << worker->output();
  const int health_port =
      static_cast<int>(IntField(*worker, "health service on port "));
  ASSERT_GT(health_port, 0) << worker->output();
  // Readiness is set before "joined" is logged.
  EXPECT_EQ(Health(Address(health_port), ""), kServing);
  ASSERT_TRUE(WaitForStep(port, 1, kStartTimeout)) << ps->output();

  const absl::Time signalled = absl::Now();
  worker->Signal(SIGTERM);
  EXPECT_EQ(worker->Wait(kStopDeadline), kExitInterrupted) << worker->output();
  EXPECT_LT(absl::Now() - signalled, kStopDeadline);
  const int64_t stopped_at = IntField(*worker, "stopped at step ");
  EXPECT_GT(stopped_at, 0) << worker->output();
  // The step in progress was pushed and applied, none was left half done.
  const dp::v1::GetStatusResponse status = GetStatus(port);
  EXPECT_EQ(status.step(), stopped_at);
  EXPECT_EQ(status.pushed_ranks_size(), 0);

  ps->Signal(SIGTERM);
  EXPECT_EQ(ps->Wait(kStopDeadline), kExitInterrupted) << ps->output();
}

// dp-ps drained (SIGTERM) again and again while the workers are in their
// steps, and restarted on its port each time, as Kubernetes replaces an
// evicted pod: a call cut off by the drain is retried, so the workers ride
// it out and finish the job; a worker that exits on it is a failed pod.
void WorkersRideOutRepeatedDrains(const std::string& data_plane) {
  constexpr int kDrains = 6;
  TempDir dir;
  std::vector<std::string> flags = kLongJob;
  flags.push_back("--workers=2");
  flags.push_back("--checkpoint_dir=" + dir.File("ckpt"));
  flags.push_back("--checkpoint_every=0");  // only the drains' own
  int port = 0;
  auto ps = StartServer(flags, &port);
  ASSERT_GT(port, 0) << ps->output();
  const std::vector<std::string> worker_flags = {"--data_plane=" + data_plane};
  auto w0 = StartWorker(port, 0, worker_flags);
  auto w1 = StartWorker(port, 1, worker_flags);
  int64_t step = 0;
  for (int drain = 0; drain < kDrains; ++drain) {
    ASSERT_FALSE(w0->Wait(absl::ZeroDuration()).has_value()) << w0->output();
    ASSERT_FALSE(w1->Wait(absl::ZeroDuration()).has_value()) << w1->output();
    // Both workers in their steps: some progress since the last restart.
    ASSERT_TRUE(WaitForStep(port, step + 20, kStartTimeout))
        << "drain " << drain << ": " << ps->output() << w0->output()
        << w1->output();
    ps->Signal(SIGTERM);
    ASSERT_EQ(ps->Wait(kStopDeadline), kExitInterrupted) << ps->output();
    step = IntField(*ps, "stopped by signal 15 at step ");
    int again = 0;
    ps = StartServer(flags, &again, port);
    ASSERT_EQ(again, port) << ps->output();
  }
  // Every worker is still in the job: none exited on a drain, and both
  // still make steps. (They are killed, not stopped: two workers stopped
  // together may stop a step apart, one then waiting at the barrier for a
  // push that never comes, which is what --stop_timeout_s bounds and not
  // what this test is about.)
  ASSERT_TRUE(WaitForStep(port, step + 20, kStartTimeout)) << ps->output();
  for (Subprocess* w : {w0.get(), w1.get()}) {
    EXPECT_FALSE(w->Wait(absl::ZeroDuration()).has_value()) << w->output();
    w->Signal(SIGKILL);
    EXPECT_EQ(w->Wait(kStopDeadline), 128 + SIGKILL) << w->output();
    // The worker's own error line ("[tag] error: ..."), not gRPC's reason
    // in a retry line ("failed to connect to all addresses; last error:
    // UNKNOWN: ...: connection attempt timed out before receiving SETTINGS
    // frame"), which a loaded machine shows while dp-ps restarts.
    EXPECT_EQ(w->output().find("] error: "), std::string::npos)
        << w->output();
  }
  ps->Signal(SIGTERM);
  EXPECT_EQ(ps->Wait(kStopDeadline), kExitInterrupted) << ps->output();
}

TEST(ShutdownTest, WorkersRideOutRepeatedDrainsOfDpPsOverGrpc) {
  WorkersRideOutRepeatedDrains("grpc");
}

TEST(ShutdownTest, WorkersRideOutRepeatedDrainsOfDpPsOverSharedMemory) {
  WorkersRideOutRepeatedDrains("shm");
}

TEST(ShutdownTest, WorkerIsNotReadyUntilJoinedAndStopsWhileWaitingForDpPs) {
  // Nothing listens on port 1: the worker retries and never joins.
  auto worker = StartWorker(
      1, 0, {"--health_port=0", "--retry_for_s=600", "--stop_timeout_s=1"});
  ASSERT_TRUE(worker->WaitForOutput("health service on port ", kStartTimeout))
      << worker->output();
  const std::string health =
      Address(static_cast<int>(IntField(*worker, "health service on port ")));
  EXPECT_EQ(Health(health, ""), kNotServing);
  EXPECT_EQ(Health(health, kLivenessService), kServing);

  const absl::Time signalled = absl::Now();
  worker->Signal(SIGTERM);
  EXPECT_EQ(worker->Wait(kStopDeadline), kExitInterrupted) << worker->output();
  EXPECT_LT(absl::Now() - signalled, kStopDeadline);
  EXPECT_NE(worker->output().find("did not end within 1 s"), std::string::npos)
      << worker->output();
}

TEST(ShutdownTest, ExitWhenDoneFalseServesTheFinalStateUntilSigtermThenExits0) {
  int port = 0;
  auto ps = StartServer({"--workers=1", "--dataset=synthetic", "--max_steps=3",
                         "--exit_when_done=false"},
                        &port);
  auto worker = StartWorker(port, 0);
  EXPECT_EQ(worker->Wait(kStartTimeout), kExitOk) << worker->output();
  ASSERT_TRUE(ps->WaitForOutput("until SIGTERM", kStartTimeout))
      << ps->output();
  EXPECT_EQ(Health(Address(port), ""), kServing);
  EXPECT_EQ(GetStatus(port).step(), 3);
  ps->Signal(SIGTERM);
  EXPECT_EQ(ps->Wait(kStopDeadline), kExitOk) << ps->output();
}

// --dry_run: what the manifests' cross-check relies on.

TEST(DryRunTest, PrintsTheEffectiveConfigurationFlagsWinningOverEnvironment) {
  Subprocess ps({DP_PS_BINARY, "--dry_run", "--epochs=7"},
                {"DP_EPOCHS=5", "DP_WORKERS=4"});
  EXPECT_EQ(ps.Wait(kStopDeadline), kExitOk) << ps.output();
  EXPECT_NE(ps.output().find("--epochs=7\n"), std::string::npos) << ps.output();
  EXPECT_NE(ps.output().find("--workers=4\n"), std::string::npos)
      << ps.output();
  // Nothing started.
  EXPECT_EQ(ps.output().find("listening"), std::string::npos) << ps.output();

  Subprocess worker({DP_WORKER_BINARY, "--dry_run"},
                    {"JOB_COMPLETION_INDEX=3", "DP_PS=dp-ps:5000"});
  EXPECT_EQ(worker.Wait(kStopDeadline), kExitOk) << worker.output();
  EXPECT_NE(worker.output().find("--rank=3\n"), std::string::npos)
      << worker.output();
  EXPECT_NE(worker.output().find("--ps=dp-ps:5000\n"), std::string::npos)
      << worker.output();
}

TEST(DryRunTest, RefusesDpVariablesThatNoFlagReads) {
  // A typo, and a variable meant for the other program.
  Subprocess ps({DP_PS_BINARY, "--dry_run"}, {"DP_EPOCH=5"});
  EXPECT_EQ(ps.Wait(kStopDeadline), kExitConfigError);
  EXPECT_NE(ps.output().find("DP_EPOCH"), std::string::npos) << ps.output();
  Subprocess worker({DP_WORKER_BINARY, "--dry_run", "--rank=0"},
                    {"DP_WORKERS=2"});
  EXPECT_EQ(worker.Wait(kStopDeadline), kExitConfigError);
  EXPECT_NE(worker.output().find("DP_WORKERS"), std::string::npos)
      << worker.output();
}

TEST(DryRunTest, RefusesInvalidValuesWithTheConfigurationErrorCode) {
  const std::vector<std::vector<std::string>> cases = {
      {DP_PS_BINARY, "--dry_run", "--workers=0"},
      {DP_PS_BINARY, "--dry_run", "--dataset=cifar"},
      {DP_PS_BINARY, "--dry_run", "--port=70000"},
      {DP_PS_BINARY, "--dry_run", "--weight_encoding=fp8"},
      {DP_PS_BINARY, "--dry_run", "--update_threads=-1"},
      {DP_PS_BINARY, "--dry_run", "--shards=0"},
      {DP_PS_BINARY, "--dry_run", "--shards=2", "--shard=2"},
      {DP_PS_BINARY, "--dry_run", "--shards=2", "--shard=0"},  // no peers
      {DP_PS_BINARY, "--dry_run", "--shards=65", "--shard=1"},
      {DP_PS_BINARY, "--dry_run", "--micro_batch=-1"},
      {DP_PS_BINARY, "--dry_run", "--global_batch=100", "--micro_batch=16"},
      {DP_PS_BINARY, "--dry_run", "--min_workers=3"},
      {DP_PS_BINARY, "--dry_run", "--on_worker_loss=retry"},
      {DP_PS_BINARY, "--dry_run", "--straggler_factor=1"},
      {DP_PS_BINARY, "--dry_run", "--spin_us=10001"},
      {DP_WORKER_BINARY, "--dry_run", "--rank=0", "--spin_us=-1"},
      {DP_WORKER_BINARY, "--dry_run", "--rank=0", "--ps=a:1,b"},
      {DP_WORKER_BINARY, "--dry_run", "--rank=0", "--ps=ps-{shard}:1"},
      {DP_WORKER_BINARY, "--dry_run", "--rank=0", "--ps=no-port"},
      {DP_WORKER_BINARY, "--dry_run", "--rank=0", "--backend=tpu"},
      {DP_WORKER_BINARY, "--dry_run", "--rank=0", "--health_port=-2"},
      {DP_WORKER_BINARY, "--dry_run", "--rank=0", "--data_plane=rdma"},
      {DP_WORKER_BINARY, "--dry_run", "--rank=-2"},
      // Checked when the backend is chosen, before the worker connects.
      {DP_WORKER_BINARY, "--rank=0", "--ps=127.0.0.1:1", "--device=-2"},
  };
  for (const auto& argv : cases) {
    Subprocess p(argv);
    EXPECT_EQ(p.Wait(kStopDeadline), kExitConfigError)
        << argv.back() << ": " << p.output();
  }
}

// The step's shape and the elastic flags: each refusal names the flag, and
// the bound it broke.
TEST(DryRunTest, RefusesBadElasticFlagsNamingThem) {
  struct Case {
    std::vector<std::string> flags;
    std::string error;
  };
  const std::vector<Case> cases = {
      {{"--micro_batch=-1"},
       "--micro_batch must be in 0..65536 (0 = --batch_size)"},
      {{"--micro_batch=70000"}, "--micro_batch must be in 0..65536"},
      {{"--global_batch=-64"},
       "--global_batch must be a positive multiple of --micro_batch (64), "
       "got -64"},
      {{"--global_batch=100", "--micro_batch=16"},
       "--global_batch must be a positive multiple of --micro_batch (16), "
       "got 100"},
      // The default global batch (--batch_size x --workers) too.
      {{"--workers=2", "--batch_size=64", "--micro_batch=48"},
       "--global_batch must be a positive multiple of --micro_batch (48), "
       "got 128 (--batch_size x --workers)"},
      {{"--global_batch=1048576", "--micro_batch=1"},
       "--global_batch / --micro_batch must be at most 65536"},
      {{"--workers=4", "--min_workers=0"},
       "--min_workers must be in 1..4 (--workers), got 0"},
      {{"--workers=4", "--min_workers=5"},
       "--min_workers must be in 1..4 (--workers), got 5"},
      {{"--on_worker_loss=retry"},
       "--on_worker_loss must be reassign, wait or fail, got 'retry'"},
      {{"--backup_blocks=-1"}, "--backup_blocks must be in 0..2"},
      // At most the micro-batches a step: 64 / 16.
      {{"--global_batch=64", "--micro_batch=16", "--backup_blocks=5"},
       "--backup_blocks must be in 0..4 (the micro-batches a step), got 5"},
      {{"--straggler_factor=1"}, "--straggler_factor must be a number > 1"},
      {{"--straggler_factor=inf"}, "--straggler_factor must be a number > 1"},
      {{"--straggler_min_wait_ms=-1"},
       "--straggler_min_wait_ms must be >= 0, got -1"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {DP_PS_BINARY, "--dry_run"};
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    Subprocess p(argv);
    EXPECT_EQ(p.Wait(kStopDeadline), kExitConfigError) << p.output();
    EXPECT_NE(p.output().find("configuration error: " + c.error),
              std::string::npos)
        << c.flags.back() << ": " << p.output();
  }
  // Their bounds are accepted.
  Subprocess edge({DP_PS_BINARY, "--dry_run", "--workers=4", "--min_workers=4",
                   "--global_batch=48", "--micro_batch=16", "--backup_blocks=3",
                   "--straggler_factor=1.01", "--straggler_min_wait_ms=0",
                   "--on_worker_loss=wait"});
  EXPECT_EQ(edge.Wait(kStopDeadline), kExitOk) << edge.output();
  Subprocess off({DP_PS_BINARY, "--dry_run", "--backup_blocks=0",
                  "--on_worker_loss=fail"});
  EXPECT_EQ(off.Wait(kStopDeadline), kExitOk) << off.output();
}

// The optimiser's flags: torch's ranges (eps > 0, too), each refusal naming
// the flag and the bound it broke, and the checks that relate them.
TEST(DryRunTest, RefusesBadOptimiserFlagsNamingThem) {
  struct Case {
    std::vector<std::string> flags;
    std::string error;
  };
  const std::vector<Case> cases = {
      {{"--optimizer=sgd"}, "--optimizer must be adam or adamw, got 'sgd'"},
      {{"--beta1=1"}, "--beta1 must be a number < 1, got 1"},
      {{"--beta2=-0.1"}, "--beta2 must be a number >= 0, got -0.1"},
      {{"--eps=0"}, "--eps must be a number > 0, got 0"},
      {{"--weight_decay=1.5"}, "--weight_decay must be a number <= 1, got 1.5"},
      {{"--weight_decay=nan"}, "--weight_decay must be a number >= 0, got nan"},
      {{"--lr_schedule=linear"},
       "--lr_schedule must be constant, cosine or step, got 'linear'"},
      {{"--warmup_steps=-1"}, "--warmup_steps must be >= 0, got -1"},
      {{"--lr_min=-1"}, "--lr_min must be a number >= 0, got -1"},
      {{"--lr_step_every=-2"}, "--lr_step_every must be >= 0, got -2"},
      {{"--lr_gamma=0"}, "--lr_gamma must be a number > 0, got 0"},
      {{"--lr_gamma=2"}, "--lr_gamma must be a number <= 1, got 2"},
      {{"--clip_grad_norm=-1"}, "--clip_grad_norm must be a number >= 0"},
      {{"--lr=0.001", "--lr_min=0.01"},
       "--lr_min must be at most --lr (0.001), got 0.01"},
      {{"--lr_schedule=step"},
       "--lr_step_every must be >= 1 for --lr_schedule=step, got 0"},
      {{"--optimizer=adamw", "--lr=4", "--weight_decay=0.5"},
       "--optimizer=adamw needs --lr x --weight_decay <= 1 (the weights are "
       "scaled by 1 - lr x wd each step), got 4 x 0.5"},
      {{"--clip_grad_norm=1", "--shards=2", "--shard=0"},
       "--clip_grad_norm needs the whole gradient in one dp-ps, got "
       "--shards=2"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {DP_PS_BINARY, "--dry_run"};
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    Subprocess p(argv);
    EXPECT_EQ(p.Wait(kStopDeadline), kExitConfigError) << p.output();
    EXPECT_NE(p.output().find("configuration error: " + c.error),
              std::string::npos)
        << c.flags.back() << ": " << p.output();
  }
  // Their bounds are accepted.
  Subprocess edge({DP_PS_BINARY, "--dry_run", "--optimizer=adamw", "--lr=2",
                   "--weight_decay=0.5", "--beta1=0", "--beta2=0.999999",
                   "--eps=1e-30", "--lr_schedule=step", "--lr_step_every=1",
                   "--lr_gamma=1", "--lr_min=2", "--warmup_steps=0",
                   "--clip_grad_norm=0", "--shards=2", "--shard=1"});
  EXPECT_EQ(edge.Wait(kStopDeadline), kExitOk) << edge.output();
}

// The configuration dp-ps hands to workers, as GetStatus shows it.
dp::v1::JobConfig ServedConfig(std::vector<std::string> flags) {
  flags.push_back("--dataset=synthetic");
  int port = 0;
  auto ps = StartServer(flags, &port);
  if (port <= 0) {
    ADD_FAILURE() << ps->output();
    return {};
  }
  dp::v1::JobConfig config = GetStatus(port).config();
  ps->Signal(SIGTERM);
  EXPECT_EQ(ps->Wait(kStopDeadline), kExitInterrupted) << ps->output();
  return config;
}

TEST(ElasticFlagsTest, DefaultsKeepOneMicroBatchOfBatchSizePerWorker) {
  const dp::v1::JobConfig c = ServedConfig({"--workers=3", "--batch_size=8"});
  EXPECT_EQ(c.world_size(), 3);
  EXPECT_EQ(c.batch_size(), 8);
  EXPECT_EQ(c.micro_batches(), 3);
  EXPECT_EQ(c.min_workers(), 1);
}

// The optimiser's flags reach the job's configuration, and the defaults are
// torch.optim.Adam's.
TEST(ElasticFlagsTest, OptimiserFlagsReachTheJobsConfiguration) {
  const dp::v1::Optimizer d = ServedConfig({}).optimizer();
  EXPECT_FALSE(d.adamw());
  EXPECT_EQ(d.beta1(), 0.9);
  EXPECT_EQ(d.beta2(), 0.999);
  EXPECT_EQ(d.eps(), 1e-8);
  EXPECT_EQ(d.weight_decay(), 0.0);
  EXPECT_EQ(d.lr_schedule(), dp::v1::LR_SCHEDULE_CONSTANT);
  EXPECT_EQ(d.clip_grad_norm(), 0.0);
  const dp::v1::JobConfig c = ServedConfig(
      {"--optimizer=adamw", "--lr=0.003", "--beta1=0.8", "--beta2=0.99",
       "--eps=1e-6", "--weight_decay=0.05", "--lr_schedule=cosine",
       "--warmup_steps=7", "--lr_min=1e-5", "--lr_step_every=11",
       "--lr_gamma=0.5", "--clip_grad_norm=2.5"});
  EXPECT_EQ(c.lr(), 0.003);
  const dp::v1::Optimizer& o = c.optimizer();
  EXPECT_TRUE(o.adamw());
  EXPECT_EQ(o.beta1(), 0.8);
  EXPECT_EQ(o.beta2(), 0.99);
  EXPECT_EQ(o.eps(), 1e-6);
  EXPECT_EQ(o.weight_decay(), 0.05);
  EXPECT_EQ(o.lr_schedule(), dp::v1::LR_SCHEDULE_COSINE);
  EXPECT_EQ(o.warmup_steps(), 7);
  EXPECT_EQ(o.lr_min(), 1e-5);
  EXPECT_EQ(o.lr_step_every(), 11);
  EXPECT_EQ(o.lr_gamma(), 0.5);
  EXPECT_EQ(o.clip_grad_norm(), 2.5);
}

TEST(ElasticFlagsTest, GlobalAndMicroBatchSetTheMicroBatchesOfAStep) {
  const dp::v1::JobConfig c =
      ServedConfig({"--workers=3", "--batch_size=8", "--global_batch=64",
                    "--micro_batch=4", "--min_workers=2"});
  EXPECT_EQ(c.world_size(), 3);
  EXPECT_EQ(c.batch_size(), 4);
  EXPECT_EQ(c.micro_batches(), 16);
  EXPECT_EQ(c.min_workers(), 2);
  // --micro_batch alone splits the default global batch (8 x 3).
  const dp::v1::JobConfig d =
      ServedConfig({"--workers=3", "--batch_size=8", "--micro_batch=2"});
  EXPECT_EQ(d.batch_size(), 2);
  EXPECT_EQ(d.micro_batches(), 12);
}

}  // namespace
}  // namespace dp
