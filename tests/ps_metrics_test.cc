// What dp-ps records about real gRPC requests: rejections by reason, update
// time, per-rank barrier waits, bytes, active ranks; bad ranks create no
// series.
#include <grpcpp/grpcpp.h>

#include <cmath>

#include "common/grpc_status.h"
#include "common/metrics.h"
#include "gtest/gtest.h"
#include "server/ps_service.h"
#include "server/server_metrics.h"
#include "tests/exposition.h"
#include "tests/in_process_ps.h"

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
    dp::v1::RegisterRequest req;
    req.set_rank(rank);
    req.set_model_fingerprint(layout_.Fingerprint());
    req.mutable_data()->set_num_samples(1000);
    req.mutable_data()->set_hash(77);
    dp::v1::RegisterResponse resp;
    grpc::ClientContext ctx;
    return stub_->Register(&ctx, req, &resp);
  }

  dp::v1::PushRequest PushRequest(int rank, int64_t step) const {
    std::vector<float> g(layout_.num_params());
    for (size_t i = 0; i < g.size(); ++i)
      g[i] = 0.01f * std::sin(0.1f * i + rank);
    dp::v1::PushRequest req;
    req.set_rank(rank);
    req.set_step(step);
    req.set_loss(1.0f);
    req.set_gradient(std::string(reinterpret_cast<const char*>(g.data()),
                                 g.size() * sizeof(float)));
    return req;
  }

  grpc::Status Push(const dp::v1::PushRequest& req) {
    dp::v1::PushResponse resp;
    grpc::ClientContext ctx;
    return stub_->Push(&ctx, req, &resp);
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

}  // namespace
}  // namespace dp
