// What dp-ps records about real gRPC requests: rejections by reason, update
// time, per-rank barrier waits, bytes, active ranks, the coordinator's
// elasticity; bad ranks create no series.
#include <grpcpp/grpcpp.h>

#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/job_failure.h"
#include "common/metrics.h"
#include "gtest/gtest.h"
#include "proto/grpc_status.h"
#include "server/ps_service.h"
#include "server/server_metrics.h"
#include "server/step_coordinator.h"
#include "tests/exposition.h"
#include "tests/in_process_ps.h"
#include "tests/raw_client.h"

namespace dp {
namespace {

constexpr int kWorld = 2;
const std::map<std::string, std::string> kPs = {{"role", "ps"}, {"shard", "0"}};

class PsMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    InProcessPsOptions options;
    options.world_size = kWorld;
    options.metrics = &metrics_;
    auto ps = InProcessPs::Start(options);
    ASSERT_TRUE(ps.ok()) << ps.status();
    ps_ = std::move(*ps);
    coordinator_ = &ps_->coordinator();
    stub_ = &ps_->stub();
  }

  grpc::Status Register(int rank) {
    return RawRegister(*stub_, RawRegisterRequest(rank, layout_.Fingerprint(),
                                                  DataFingerprint{1000, 77}));
  }

  dp::v1::PushRequest PushRequest(int rank, int64_t step) const {
    std::vector<float> g(layout_.num_params());
    for (size_t i = 0; i < g.size(); ++i)
      g[i] = 0.01f * std::sin(0.1f * i + rank);
    return RawPushRequest(rank, step, g);
  }

  // rank's push of `block` (its own micro-batch when empty).
  dp::v1::PushRequest BlockPush(int rank, int64_t step, Block block) const {
    dp::v1::PushRequest req = PushRequest(rank, step);
    req.mutable_block()->set_first(block.first);
    req.mutable_block()->set_count(block.count);
    return req;
  }

  grpc::Status Push(const dp::v1::PushRequest& req) {
    return RawPush(*stub_, req);
  }

  grpc::Status Barrier(int rank, int64_t step, absl::Duration timeout) {
    dp::v1::BarrierRequest req;
    req.set_rank(rank);
    req.set_step(step);
    dp::v1::BarrierResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    return stub_->Barrier(&ctx, req, &resp);
  }

  std::map<std::string, double> Scrape() {
    return ParseExposition(metrics_.Text());
  }
  std::optional<double> Rejected(const std::map<std::string, double>& s,
                                 const std::string& reason) {
    return Sample(s, "dp_ps_rejected_requests_total",
                  {{"role", "ps"}, {"shard", "0"}, {"reason", reason}});
  }

  const ModelLayout layout_ = ModelLayout::SimpleNet();
  ServerMetrics metrics_{kWorld};
  std::unique_ptr<InProcessPs> ps_;
  StepCoordinator* coordinator_ = nullptr;
  dp::v1::ParameterServer::Stub* stub_ = nullptr;
};

TEST_F(PsMetricsTest, RejectionsAreCountedByReasonAndBadRanksCreateNoSeries) {
  EXPECT_EQ(Push(PushRequest(1, 0)).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);  // not registered
  ASSERT_TRUE(Register(0).ok());
  ASSERT_TRUE(Register(1).ok());
  EXPECT_EQ(Push(PushRequest(7, 0)).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);  // rank out of range
  EXPECT_EQ(Push(PushRequest(0, 5)).error_code(),
            grpc::StatusCode::ABORTED);  // future step
  EXPECT_EQ(Barrier(0, 3, absl::Seconds(5)).error_code(),
            grpc::StatusCode::ABORTED);  // future barrier
  // Rank 0 waits for rank 1 until its own deadline: the client gives up,
  // which is not a rejection.
  ASSERT_TRUE(Push(PushRequest(0, 0)).ok());
  EXPECT_EQ(Barrier(0, 0, absl::Milliseconds(200)).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);

  const auto s = Scrape();
  EXPECT_EQ(Rejected(s, "failed_precondition"), 1);
  EXPECT_EQ(Rejected(s, "invalid_argument"), 1);
  EXPECT_EQ(Rejected(s, "aborted"), 2);
  EXPECT_EQ(Rejected(s, "deadline_exceeded"), 0);
  EXPECT_EQ(metrics_.Text().find("rank=\"7\""), std::string::npos);
  EXPECT_EQ(metrics_.ActiveWorkers(), 2);
}

// A failed job (e.g. --on_worker_loss=fail) answers with a documented code
// that workers do not retry or re-sync on, tells it apart from "not
// registered", and counts it as a rejection.
TEST_F(PsMetricsTest, JobFailureIsFailedPreconditionAndCountedAsRejection) {
  ASSERT_TRUE(Register(0).ok());
  ASSERT_TRUE(Register(1).ok());
  ASSERT_TRUE(Push(PushRequest(0, 0)).ok());
  coordinator_->Fail(JobFailedError("rank 1 was lost"));
  const grpc::Status barrier = Barrier(0, 0, absl::Seconds(30));
  const grpc::Status push = Push(PushRequest(1, 0));
  for (const grpc::Status& s : {barrier, push}) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_EQ(s.error_message(), "the job failed: rank 1 was lost");
    EXPECT_TRUE(IsJobFailed(FromGrpcStatus(s)));
  }
  EXPECT_EQ(Rejected(Scrape(), "failed_precondition"), 2);
  EXPECT_FALSE(
      IsJobFailed(absl::FailedPreconditionError("rank 1 has not registered")));
  EXPECT_TRUE(coordinator_->Status().failed);
}

// dp_training_failed follows the coordinator's status (ps_server.cc mirrors
// it at scrape time): 0 from the start, 1 once the job failed.
TEST(ServerMetricsProgressTest, AFailedJobIsOneFromZero) {
  ServerMetrics m(2);
  EXPECT_EQ(Sample(ParseExposition(m.Text()), "dp_training_failed", kPs), 0);
  ServerMetrics::Progress p;
  p.step = 12;
  p.failed = true;
  m.SetProgress(p);
  EXPECT_EQ(Sample(ParseExposition(m.Text()), "dp_training_failed", kPs), 1);
}

// The checkpoint series exist on every dp-ps, at 0 without checkpoints;
// the failure counter follows the store's cumulative count and never goes
// down, the newest step follows the disk (back, too, after a rollback).
TEST(ServerMetricsCheckpointTest, SeriesExistAtZeroAndFollowTheStore) {
  ServerMetrics m(2);
  auto values = [&m]() {
    const auto s = ParseExposition(m.Text());
    return std::vector<std::optional<double>>{
        Sample(s, "dp_ps_checkpoint_interval_steps", kPs),
        Sample(s, "dp_ps_checkpoint_step", kPs),
        Sample(s, "dp_ps_checkpoint_write_failures_total", kPs)};
  };
  using V = std::vector<std::optional<double>>;
  EXPECT_EQ(values(), (V{0, 0, 0}));
  m.SetCheckpoints({100, 300, 0});  // resumed from step 300
  EXPECT_EQ(values(), (V{100, 300, 0}));
  m.SetCheckpoints({100, 300, 2});
  m.SetCheckpoints({100, 300, 2});  // the same count again: no change
  EXPECT_EQ(values(), (V{100, 300, 2}));
  m.SetCheckpoints({100, 200, 3});  // a rollback, and one more failure
  EXPECT_EQ(values(), (V{100, 200, 3}));
  m.SetCheckpoints({100, 400, 1});  // lower (never, from one store): stays
  EXPECT_EQ(values(), (V{100, 400, 3}));
}

TEST_F(PsMetricsTest, AStepRecordsUpdateTimeBarrierWaitPerRankAndBytes) {
  ASSERT_TRUE(Register(0).ok());
  ASSERT_TRUE(Register(1).ok());
  const dp::v1::PushRequest p0 = PushRequest(0, 0), p1 = PushRequest(1, 0);
  ASSERT_TRUE(Push(p0).ok());
  ASSERT_TRUE(Push(p1).ok());  // the last push applies the update
  ASSERT_TRUE(Barrier(0, 0, absl::Seconds(10)).ok());
  ASSERT_TRUE(Barrier(1, 0, absl::Seconds(10)).ok());
  dp::v1::PullRequest pull;
  pull.set_rank(1);
  dp::v1::PullResponse weights;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub_->Pull(&ctx, pull, &weights).ok());

  const auto s = Scrape();
  EXPECT_EQ(Sample(s, "dp_ps_update_duration_seconds_count", kPs), 1);
  EXPECT_GT(*Sample(s, "dp_ps_update_duration_seconds_sum", kPs), 0);
  for (const char* rank : {"0", "1"}) {
    EXPECT_EQ(Sample(s, "dp_ps_barrier_wait_duration_seconds_count",
                     {{"role", "ps"}, {"shard", "0"}, {"rank", rank}}),
              1)
        << "rank " << rank;
  }
  EXPECT_EQ(Sample(s, "dp_received_bytes_total", kPs),
            p0.ByteSizeLong() + p1.ByteSizeLong());
  EXPECT_EQ(Sample(s, "dp_sent_bytes_total", kPs), weights.ByteSizeLong());
  EXPECT_GE(weights.ByteSizeLong(), 4u * layout_.num_params());
  for (const auto& [series, value] : s) {
    if (series.find("rejected") != std::string::npos) {
      EXPECT_EQ(value, 0) << series;
    }
    // A dp-ps of one shard is shard 0, like the first shard of many.
    EXPECT_NE(series.find("shard=\"0\""), std::string::npos) << series;
  }
}

// The coordinator's elasticity on a real endpoint, mirrored at scrape time
// as dp-ps does it (ps_server.cc): the live ranks, the plan, the blocks
// handed on and copied, and per rank the steps that waited for it last.
TEST_F(PsMetricsTest, ElasticityIsMirroredAtScrapeTime) {
  auto endpoint = metrics_.Serve("127.0.0.1", kMetricsAnyPort, [this] {
    metrics_.SetElasticity(ElasticityOf(coordinator_->Status()));
  });
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  auto scrape = [port]() {
    absl::StatusOr<std::string> text = HttpGet("127.0.0.1", port, "/metrics");
    EXPECT_TRUE(text.ok()) << text.status();
    return ParseExposition(text.ok() ? *text : "");
  };
  auto of_rank = [](int rank) {
    return std::map<std::string, std::string>{
        {"role", "ps"}, {"shard", "0"}, {"rank", absl::StrCat(rank)}};
  };
  // The values a scrape shows, in the order of `expected` below.
  auto values = [&](const std::map<std::string, double>& s) {
    std::vector<std::optional<double>> v = {
        Sample(s, "dp_ps_live_workers", kPs),
        Sample(s, "dp_ps_micro_batches", kPs),
        Sample(s, "dp_ps_planned_micro_batches", of_rank(0)),
        Sample(s, "dp_ps_planned_micro_batches", of_rank(1)),
        Sample(s, "dp_ps_blocks_reassigned_total", kPs),
        Sample(s, "dp_ps_backup_blocks_total", kPs),
        Sample(s, "dp_ps_duplicate_pushes_total", kPs),
        Sample(s, "dp_ps_steps_completed_by_total", of_rank(0)),
        Sample(s, "dp_ps_steps_completed_by_total", of_rank(1))};
    return v;
  };
  using V = std::vector<std::optional<double>>;
  // live, micro-batches, planned 0 and 1, reassigned, backups, duplicates,
  // completed by 0 and 1: every series exists from the start.
  EXPECT_EQ(values(scrape()), (V{0, 2, 0, 0, 0, 0, 0, 0, 0}));
  ASSERT_TRUE(Register(0).ok());
  ASSERT_TRUE(Register(1).ok());
  EXPECT_EQ(values(scrape()), (V{2, 2, 1, 1, 0, 0, 0, 0, 0}));

  // Step 0: rank 1 pushes its micro-batch and rank 0 a copy of it (the
  // first counts, the copy is a duplicate), then its own, which completes
  // the step: the step waited for rank 0.
  ASSERT_TRUE(Push(PushRequest(1, 0)).ok());
  ASSERT_TRUE(Push(BlockPush(0, 0, Block{1, 1})).ok());
  ASSERT_TRUE(Push(PushRequest(0, 0)).ok());
  EXPECT_EQ(values(scrape()), (V{2, 2, 1, 1, 0, 0, 1, 1, 0}));

  // Step 1: rank 0 pushes and waits; rank 1 is silent past its lease, so
  // its block goes to rank 0's wait, and rank 0's push of it completes the
  // step. The next plan is rank 0's alone.
  ASSERT_TRUE(Push(PushRequest(0, 1)).ok());
  Block handed;
  absl::Notification woken;
  auto ticket = coordinator_->WaitForStep(
      0, 1, [&](const absl::Status& s, int64_t, Block work) {
        EXPECT_TRUE(s.ok()) << s;
        handed = work;
        woken.Notify();
      });
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  ASSERT_FALSE(ticket->ready);
  ASSERT_EQ(coordinator_->CheckLeases(absl::ZeroDuration()).size(), 1u);
  ASSERT_TRUE(woken.HasBeenNotified());  // called inside CheckLeases
  ASSERT_EQ(handed, (Block{1, 1}));
  ASSERT_TRUE(Push(BlockPush(0, 1, handed)).ok());
  ASSERT_EQ(coordinator_->Status().step, 2);
  const V after = {1, 2, 2, 0, 1, 0, 1, 2, 0};
  EXPECT_EQ(values(scrape()), after);
  // Scrapes mirror the coordinator's counts; they add nothing themselves.
  EXPECT_EQ(values(ParseExposition(metrics_.Text())), after);
  EXPECT_EQ(values(scrape()), after);
}

// SetElasticity's counters follow cumulative counts: they grow by the
// difference, never go down, and ignore ranks beyond --workers.
TEST(ServerMetricsElasticityTest, CountersFollowCumulativeCounts) {
  ServerMetrics m(2);
  ServerMetrics::Elasticity e;
  e.live_workers = 2;
  e.micro_batches = 4;
  e.planned_micro_batches = {3, 1, 7};  // a third rank: no series
  e.blocks_reassigned = 2;
  e.backup_blocks = 3;
  e.duplicate_pushes = 4;
  e.steps_completed_by = {5, 6, 9};
  m.SetElasticity(e);
  m.SetElasticity(e);  // the same counts again: no change
  auto s = ParseExposition(m.Text());
  auto rank = [](const char* r) {
    return std::map<std::string, std::string>{
        {"role", "ps"}, {"shard", "0"}, {"rank", r}};
  };
  EXPECT_EQ(Sample(s, "dp_ps_planned_micro_batches", rank("0")), 3);
  EXPECT_EQ(Sample(s, "dp_ps_planned_micro_batches", rank("1")), 1);
  EXPECT_EQ(Sample(s, "dp_ps_backup_blocks_total", kPs), 3);
  EXPECT_EQ(Sample(s, "dp_ps_steps_completed_by_total", rank("1")), 6);
  EXPECT_EQ(m.Text().find("rank=\"2\""), std::string::npos);
  e.planned_micro_batches = {4};  // rank 1 has no block now
  e.backup_blocks = 5;
  e.duplicate_pushes = 1;  // lower: the counter stays
  e.steps_completed_by = {5, 8};
  m.SetElasticity(e);
  e.duplicate_pushes = 2;  // grows again from the lower mark
  m.SetElasticity(e);
  s = ParseExposition(m.Text());
  EXPECT_EQ(Sample(s, "dp_ps_planned_micro_batches", rank("1")), 0);
  EXPECT_EQ(Sample(s, "dp_ps_blocks_reassigned_total", kPs), 2);
  EXPECT_EQ(Sample(s, "dp_ps_backup_blocks_total", kPs), 5);
  EXPECT_EQ(Sample(s, "dp_ps_duplicate_pushes_total", kPs), 5);
  EXPECT_EQ(Sample(s, "dp_ps_steps_completed_by_total", rank("0")), 5);
  EXPECT_EQ(Sample(s, "dp_ps_steps_completed_by_total", rank("1")), 8);

  // ElasticityOf reads the coordinator's status field by field.
  CoordinatorStatus status;
  status.live_ranks = {0, 2};
  status.micro_batches = 8;
  status.plan = {Block{0, 4}, Block{}, Block{4, 4}};
  status.elastic = ElasticCounts{1, 2, 3};
  status.completed_by = {4, 0, 5};
  const ServerMetrics::Elasticity got = ElasticityOf(status);
  EXPECT_EQ(got.live_workers, 2);
  EXPECT_EQ(got.micro_batches, 8);
  EXPECT_EQ(got.planned_micro_batches, (std::vector<int>{4, 0, 4}));
  EXPECT_EQ(got.blocks_reassigned, 1);
  EXPECT_EQ(got.backup_blocks, 2);
  EXPECT_EQ(got.duplicate_pushes, 3);
  EXPECT_EQ(got.steps_completed_by, (std::vector<int64_t>{4, 0, 5}));
}

}  // namespace
}  // namespace dp
