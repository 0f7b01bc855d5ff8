// Bad requests through real gRPC on loopback: each gets the status code of
// docs/protocol.md and leaves weights, Adam state and step bitwise unchanged.
#include "server/ps_service.h"

#include <grpcpp/grpcpp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "proto/grpc_server.h"
#include "server/coordinator_mirror.h"
#include "tests/in_process_ps.h"
#include "tests/job_runner.h"
#include "tests/raw_client.h"
#include "tests/same_state.h"
#include "worker/ps_group.h"

namespace dp {
namespace {

constexpr int kWorld = 2;

class PsServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    InProcessPsOptions options;
    options.world_size = kWorld;
    options.client_max_message_bytes = 8 << 20;  // above the server's limit
    auto ps = InProcessPs::Start(options);
    ASSERT_TRUE(ps.ok()) << ps.status();
    ps_ = std::move(*ps);
    coordinator_ = &ps_->coordinator();
    stub_ = &ps_->stub();
  }

  grpc::Status Register(int rank, uint64_t model_fp, int64_t samples,
                        uint64_t hash,
                        dp::v1::RegisterResponse* resp = nullptr) {
    return RawRegister(
        *stub_,
        RawRegisterRequest(rank, model_fp, DataFingerprint{samples, hash}),
        resp);
  }
  grpc::Status RegisterOk(int rank, dp::v1::RegisterResponse* resp = nullptr) {
    return Register(rank, layout_.Fingerprint(), 1000, 77, resp);
  }

  std::vector<float> Gradient(int rank, int step) const {
    std::vector<float> g(layout_.num_params());
    for (size_t i = 0; i < g.size(); ++i) {
      g[i] = 0.01f * std::sin(0.1f * i + rank + 3.0f * step);
    }
    return g;
  }

  grpc::Status Push(
      int rank, int64_t step, const std::vector<float>& g,
      dp::v1::PushResponse* resp = nullptr, float loss = 1.0f,
      const std::function<void(dp::v1::PushRequest*)>& edit = nullptr) {
    dp::v1::PushRequest req = RawPushRequest(rank, step, g, loss);
    if (edit) edit(&req);
    return RawPush(*stub_, req, resp);
  }

  grpc::Status Barrier(int rank, int64_t step, absl::Duration timeout,
                       dp::v1::BarrierResponse* resp) {
    dp::v1::BarrierRequest req;
    req.set_rank(rank);
    req.set_step(step);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    return stub_->Barrier(&ctx, req, resp);
  }

  const ModelLayout layout_ = ModelLayout::SimpleNet();
  std::unique_ptr<InProcessPs> ps_;
  StepCoordinator* coordinator_ = nullptr;
  dp::v1::ParameterServer::Stub* stub_ = nullptr;
};

TEST_F(PsServiceTest, PlainProtocolPushBarrierPullAdvancesOneStep) {
  ASSERT_TRUE(RegisterOk(0).ok());
  ASSERT_TRUE(RegisterOk(1).ok());
  ASSERT_TRUE(Push(0, 0, Gradient(0, 0)).ok());
  ASSERT_TRUE(Push(1, 0, Gradient(1, 0)).ok());
  dp::v1::BarrierResponse b;
  ASSERT_TRUE(Barrier(0, 0, absl::Seconds(10), &b).ok());
  EXPECT_EQ(b.step(), 1);
  dp::v1::PullRequest pull;
  pull.set_rank(1);
  dp::v1::PullResponse weights;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub_->Pull(&ctx, pull, &weights).ok());
  EXPECT_EQ(weights.step(), 1);
  const TrainingState s = coordinator_->Snapshot();
  ASSERT_EQ(weights.params().size(), s.params.size() * 4);
  EXPECT_EQ(0, std::memcmp(weights.params().data(), s.params.data(),
                           weights.params().size()));
}

TEST_F(PsServiceTest, BarrierDeadlinePassesWhileARankIsMissing) {
  ASSERT_TRUE(RegisterOk(0).ok());
  ASSERT_TRUE(RegisterOk(1).ok());
  ASSERT_TRUE(Push(0, 0, Gradient(0, 0)).ok());
  dp::v1::BarrierResponse b;
  grpc::Status s = Barrier(0, 0, absl::Milliseconds(200), &b);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // The push is still recorded: once rank 1 pushes, the step completes and a
  // new barrier call returns.
  ASSERT_TRUE(Push(1, 0, Gradient(1, 0)).ok());
  ASSERT_TRUE(Barrier(0, 0, absl::Seconds(10), &b).ok());
  EXPECT_EQ(b.step(), 1);
}

TEST_F(PsServiceTest, BadRequestsGetDesignStatusCodesAndChangeNothing) {
  ASSERT_TRUE(RegisterOk(0).ok());
  // Rank 1 is not registered yet: its push is refused.
  const TrainingState initial = coordinator_->Snapshot();
  EXPECT_EQ(Push(1, 0, Gradient(1, 0)).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  ASSERT_TRUE(RegisterOk(1).ok());
  // Advance to step 2, then rank 0 pushes step 2.
  for (int step = 0; step < 2; ++step) {
    ASSERT_TRUE(Push(0, step, Gradient(0, step)).ok());
    ASSERT_TRUE(Push(1, step, Gradient(1, step)).ok());
  }
  ASSERT_TRUE(Push(0, 2, Gradient(0, 2)).ok());
  const StepCoordinator::ObservableState before = coordinator_->Observe();
  EXPECT_FALSE(SameState(initial, before.training));
  ASSERT_EQ(before.training.step, 2);

  std::vector<float> nan = Gradient(1, 2), inf = Gradient(1, 2);
  nan[12345] = std::numeric_limits<float>::quiet_NaN();
  inf[0] = -std::numeric_limits<float>::infinity();
  const std::vector<float> shorter(layout_.num_params() - 10, 0.0f);
  const std::vector<float> longer(layout_.num_params() + 1, 0.0f);
  const std::vector<float> ok = Gradient(1, 2);
  dp::v1::BarrierResponse b;
  struct Case {
    const char* what;
    grpc::Status status;
    grpc::StatusCode code;
  };
  const Case cases[] = {
      {"short gradient", Push(1, 2, shorter),
       grpc::StatusCode::INVALID_ARGUMENT},
      {"long gradient", Push(1, 2, longer), grpc::StatusCode::INVALID_ARGUMENT},
      {"NaN gradient", Push(1, 2, nan), grpc::StatusCode::INVALID_ARGUMENT},
      {"Inf gradient", Push(1, 2, inf), grpc::StatusCode::INVALID_ARGUMENT},
      {"rank out of range", Push(2, 2, ok), grpc::StatusCode::INVALID_ARGUMENT},
      {"idle with a gradient",
       Push(1, 2, ok, nullptr, 1.0f,
            [](dp::v1::PushRequest* r) { r->set_idle(true); }),
       grpc::StatusCode::INVALID_ARGUMENT},
      {"block that is no node",
       Push(1, 2, ok, nullptr, 1.0f,
            [](dp::v1::PushRequest* r) {
              r->mutable_block()->set_first(1);
              r->mutable_block()->set_count(2);
            }),
       grpc::StatusCode::INVALID_ARGUMENT},
      {"block past the step",
       Push(1, 5, ok, nullptr, 1.0f,
            [](dp::v1::PushRequest* r) {
              r->mutable_block()->set_first(2);
              r->mutable_block()->set_count(1);
            }),
       grpc::StatusCode::INVALID_ARGUMENT},
      {"stale step", Push(1, 0, ok), grpc::StatusCode::ABORTED},
      {"future step", Push(1, 5, ok), grpc::StatusCode::ABORTED},
      {"future barrier", Barrier(1, 4, absl::Seconds(5), &b),
       grpc::StatusCode::ABORTED},
      {"wrong model", Register(1, layout_.Fingerprint() ^ 1, 1000, 77),
       grpc::StatusCode::FAILED_PRECONDITION},
      {"different data", Register(1, layout_.Fingerprint(), 1000, 78),
       grpc::StatusCode::FAILED_PRECONDITION},
      {"register rank out of range",
       Register(7, layout_.Fingerprint(), 1000, 77),
       grpc::StatusCode::INVALID_ARGUMENT},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.status.error_code(), c.code)
        << c.what << ": " << c.status.error_message();
    EXPECT_FALSE(c.status.error_message().empty()) << c.what;
  }
  // Not only the weights: registrations, pushes, leases, waiters too.
  EXPECT_EQ(ObservableDifferences(before, coordinator_->Observe()), "");

  // A duplicate push is acknowledged and counted once.
  dp::v1::PushResponse first, retry;
  ASSERT_TRUE(Push(1, 2, ok, &first).ok());
  EXPECT_FALSE(first.duplicate());
  EXPECT_EQ(first.step(), 3);
  const TrainingState after = coordinator_->Snapshot();
  ASSERT_TRUE(Push(1, 2, ok, &retry).ok());
  EXPECT_TRUE(retry.duplicate());
  EXPECT_EQ(retry.step(), 3);
  EXPECT_TRUE(SameState(after, coordinator_->Snapshot()));
}

// A worker attends (Attend) with its registration's session until it goes:
// calls naming no session, another rank's or an older one are refused and
// change nothing; the end of a call is a departure (the rank's block goes
// on); dp-ps ending the calls at shutdown is none.
TEST_F(PsServiceTest, AttendEndsWithTheWorkerOrWithDpPs) {
  auto session = [&](int rank) {
    dp::v1::RegisterResponse resp;
    EXPECT_TRUE(RegisterOk(rank, &resp).ok());
    return resp.session();
  };
  const uint64_t older = session(0);
  const uint64_t s0 = session(0);
  const uint64_t s1 = session(1);
  ASSERT_NE(older, s0);
  struct Attending {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReader<dp::v1::AttendResponse>> reader;
    // Blocks until the call ends.
    grpc::Status End() {
      dp::v1::AttendResponse r;
      EXPECT_FALSE(reader->Read(&r)) << "dp-ps sends nothing";
      return reader->Finish();
    }
  };
  auto attend = [&](int rank, uint64_t session) {
    auto a = std::make_unique<Attending>();
    dp::v1::AttendRequest req;
    req.set_rank(rank);
    req.set_session(session);
    a->reader = stub_->Attend(&a->ctx, req);
    return a;
  };
  const StepCoordinator::ObservableState before = coordinator_->Observe();
  EXPECT_EQ(attend(0, 0)->End().error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(attend(2, s0)->End().error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(attend(0, older)->End().error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(attend(1, s0)->End().error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(ObservableDifferences(before, coordinator_->Observe()), "");

  // Rank 1 pushes and waits; rank 0 attends, then goes: its block is
  // handed to rank 1 at once.
  auto a0 = attend(0, s0);
  a0->reader->WaitForInitialMetadata();
  auto a1 = attend(1, s1);
  a1->reader->WaitForInitialMetadata();
  ASSERT_TRUE(Push(1, 0, Gradient(1, 0)).ok());
  absl::Notification handed;
  Block work;
  auto ticket = coordinator_->WaitForStep(
      1, 0, [&](const absl::Status& s, int64_t, Block b) {
        EXPECT_TRUE(s.ok()) << s;
        work = b;
        handed.Notify();
      });
  ASSERT_TRUE(ticket.ok());
  ASSERT_FALSE(ticket->ready);
  a0->ctx.TryCancel();
  EXPECT_EQ(a0->End().error_code(), grpc::StatusCode::CANCELLED);
  ASSERT_TRUE(handed.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(work, (Block{0, 1}));
  EXPECT_EQ(coordinator_->Status().live_ranks, std::vector<int>{1});

  // dp-ps ends rank 1's call: no departure; a new call is refused.
  ps_->service().EndAttendance();
  EXPECT_TRUE(a1->End().ok());
  EXPECT_EQ(attend(1, s1)->End().error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(coordinator_->Status().live_ranks, std::vector<int>{1});
}

TEST_F(PsServiceTest, OversizedMessageIsResourceExhaustedAndChangesNothing) {
  ASSERT_TRUE(RegisterOk(0).ok());
  ASSERT_TRUE(RegisterOk(1).ok());
  const StepCoordinator::ObservableState before = coordinator_->Observe();
  const std::vector<float> huge(2 * layout_.num_params(), 0.0f);
  EXPECT_EQ(Push(0, 0, huge).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(ObservableDifferences(before, coordinator_->Observe()), "");
}

}  // namespace
}  // namespace dp

namespace dp {
namespace {

// The values of `w`, from wherever each tensor lies.
std::vector<float> Flat(const Weights& w) {
  std::vector<float> all;
  for (absl::Span<const float> t : w.tensors) {
    all.insert(all.end(), t.begin(), t.end());
  }
  return all;
}

// A one-worker dp-ps offering shared memory, and a client registered with
// it over `plane`.
struct SharedMemoryJob {
  void Start(DataPlane plane, Encoding weight_encoding = Encoding::kF32) {
    InProcessPsOptions options;
    options.world_size = 1;
    options.shared_memory = true;
    options.weight_encoding = weight_encoding;
    auto started = InProcessPs::Start(options);
    ASSERT_TRUE(started.ok()) << started.status();
    ps = *std::move(started);
    const ModelLayout& layout = ps->layout();
    PsClientOptions client_options;
    client_options.address = ps->address();
    client_options.max_message_bytes = MessageBytesFor(layout.num_params());
    client_options.data_plane = plane;
    client = std::make_unique<PsGroup>(
        std::vector<std::string>{client_options.address}, client_options);
    RegistrationRequest registration;
    registration.rank = 0;
    registration.model_fingerprint = layout.Fingerprint();
    registration.data = DataFingerprint{1000, 7};
    ASSERT_TRUE(client->Register(registration).ok());
    // The client's Attend call follows its registration on a thread of its
    // own: once it is in, nothing but the test's requests changes state.
    ASSERT_TRUE(PollUntil(
        [&]() -> bool { return ps->coordinator().Observe().attended[0]; },
        absl::Seconds(30)));
  }
  std::unique_ptr<InProcessPs> ps;
  std::unique_ptr<PsGroup> client;
};

// A gradient in shared memory passes the checks a gRPC one does, and a
// refused one changes nothing; the weights come back through shared memory
// equal to what gRPC sends.
TEST(PsServiceSharedMemoryTest, AGradientInItsSlotIsCheckedLikeOneOverGrpc) {
  SharedMemoryJob job;
  ASSERT_NO_FATAL_FAILURE(job.Start(DataPlane::kShm));
  auto& ps = job.ps;
  PsGroup& client = *job.client;
  const ModelLayout& layout = ps->layout();
  ASSERT_TRUE(client.shared_memory());
  PsClientOptions client_options;
  client_options.address = ps->address();
  client_options.max_message_bytes = MessageBytesFor(layout.num_params());
  absl::Span<char> slot = client.GradientSlot();
  ASSERT_EQ(slot.size(), layout.num_params() * sizeof(float));

  Weights shared;
  ASSERT_TRUE(client.Pull(0, &shared).ok());
  PsClientOptions grpc_options = client_options;
  grpc_options.data_plane = DataPlane::kGrpc;
  PsGroup over_grpc({grpc_options.address}, grpc_options);
  Weights sent;
  ASSERT_TRUE(over_grpc.Pull(0, &sent).ok());
  EXPECT_EQ(shared.step, sent.step);
  EXPECT_TRUE(shared.in_place);
  EXPECT_FALSE(sent.in_place);
  EXPECT_EQ(Flat(shared), sent.params);

  std::vector<float> g(layout.num_params(), 0.25f);
  g[1234] = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(slot.data(), g.data(), slot.size());
  Gradient gradient;
  gradient.rank = 0;
  gradient.step = 0;
  gradient.loss = 2.0f;
  gradient.num_samples = 8;
  gradient.in_shared_memory = true;
  const auto before = ps->coordinator().Observe();
  int64_t sent_bytes = 0;
  absl::Status refused = client.Push(gradient, &sent_bytes);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(refused.message().find("index 1234"), std::string::npos) << refused;
  EXPECT_EQ(ObservableDifferences(before, ps->coordinator().Observe()), "");

  g[1234] = 0.25f;
  std::memcpy(slot.data(), g.data(), slot.size());
  Weights next;
  ASSERT_TRUE(client.PushPull(gradient, &next, &sent_bytes).ok());
  EXPECT_EQ(next.step, 1);
  EXPECT_LT(sent_bytes, 100) << "the gradient did not travel over gRPC";
  ASSERT_TRUE(over_grpc.Pull(0, &sent).ok());
  EXPECT_EQ(Flat(next), sent.params);
}

// One dp-ps's float32 weights are read in place, every tensor of them, and
// left there: no copy in the worker's buffer. A version that lands in their
// buffer behind the worker's back (v + 2 while it computes from v) is
// caught by the check the worker makes before it pushes; v + 1 is not in
// its way.
TEST(PsServiceSharedMemoryTest, WeightsReadInPlaceAreCheckedBeforeAPush) {
  SharedMemoryJob job;
  ASSERT_NO_FATAL_FAILURE(job.Start(DataPlane::kShm));
  const ModelLayout& layout = job.ps->layout();
  Weights w;
  ASSERT_TRUE(job.client->Pull(0, &w).ok());
  ASSERT_EQ(w.step, 0);
  ASSERT_TRUE(w.in_place);
  ASSERT_EQ(w.tensors.size(), layout.tensors().size());
  const float* own = w.params.data();
  for (absl::Span<const float> t : w.tensors) {
    EXPECT_TRUE(t.data() < own || t.data() >= own + w.params.size())
        << "a tensor was copied";
  }
  const std::vector<float> computed_from = Flat(w);
  EXPECT_TRUE(job.client->CheckInPlaceWeights().ok());
  const std::vector<float> other(layout.num_params(), 0.5f);
  job.ps->shared_plane()->Publish(1, other);
  EXPECT_TRUE(job.client->CheckInPlaceWeights().ok());
  EXPECT_EQ(Flat(w), computed_from) << "version 1 overwrote version 0";
  job.ps->shared_plane()->Publish(2, other);
  const absl::Status stale = job.client->CheckInPlaceWeights();
  EXPECT_EQ(stale.code(), absl::StatusCode::kAborted) << stale;
  EXPECT_NE(stale.message().find("version 0"), std::string::npos) << stale;
  // A pull over gRPC reads nothing in place, and checks nothing.
  SharedMemoryJob grpc;
  ASSERT_NO_FATAL_FAILURE(grpc.Start(DataPlane::kGrpc));
  ASSERT_TRUE(grpc.client->Pull(0, &w).ok());
  EXPECT_FALSE(w.in_place);
  EXPECT_EQ(Flat(w), w.params);
  EXPECT_TRUE(grpc.client->CheckInPlaceWeights().ok());
}

// A job whose workers all take the weights through shared memory: each
// version is written there by the update that makes it, encoded as it
// goes, with no snapshot between and no pass of its own; the worker reads
// what gRPC would send.
TEST(PsServiceSharedMemoryTest, WeightsGoToSharedMemoryWithoutASnapshot) {
  for (Encoding e : {Encoding::kF32, Encoding::kBf16}) {
    SCOPED_TRACE(EncodingName(e));
    SharedMemoryJob job;
    ASSERT_NO_FATAL_FAILURE(job.Start(DataPlane::kShm, e));
    PsGroup& client = *job.client;
    ASSERT_TRUE(client.shared_memory());
    const ModelLayout& layout = job.ps->layout();
    StepCoordinator& coordinator = job.ps->coordinator();
    Weights shared;
    ASSERT_TRUE(client.Pull(0, &shared).ok());
    const int64_t steps = 3;
    for (int64_t step = 0; step < steps; ++step) {
      std::vector<float> g(layout.num_params());
      for (size_t i = 0; i < g.size(); ++i) g[i] = 0.01f * std::sin(i + step);
      absl::Span<char> slot = client.GradientSlot();
      std::memcpy(slot.data(), g.data(), slot.size());
      Gradient gradient;
      gradient.rank = 0;
      gradient.step = step;
      gradient.loss = 2.0f;
      gradient.num_samples = 8;
      gradient.in_shared_memory = true;
      int64_t sent_bytes = 0;
      ASSERT_TRUE(client.PushPull(gradient, &shared, &sent_bytes).ok());
      EXPECT_EQ(shared.step, step + 1);
      EXPECT_LT(sent_bytes, 100) << "the weights came over gRPC";
    }
    const std::vector<float> params = coordinator.Snapshot().params;
    std::vector<float> expected(params.size());
    std::string encoded(params.size() * BytesPerValue(e), '\0');
    Encode(e, params.data(), params.size(), encoded.data());
    Decode(e, encoded.data(), params.size(), expected.data());
    EXPECT_EQ(Flat(shared), expected);
    // Encoded straight into the region, in either encoding: version 0 by
    // the first pull, and every later one by the update that made it, in
    // its own pass - none written again at its answer.
    EXPECT_EQ(coordinator.Status().snapshots, 0);
    EXPECT_EQ(job.ps->shared_plane()->separate_publishes(), 1);

    PsClientOptions grpc_options;
    grpc_options.address = job.ps->address();
    grpc_options.max_message_bytes = MessageBytesFor(layout.num_params());
    grpc_options.data_plane = DataPlane::kGrpc;
    PsGroup over_grpc({grpc_options.address}, grpc_options);
    Weights sent;
    ASSERT_TRUE(over_grpc.Pull(0, &sent).ok());
    EXPECT_EQ(sent.step, steps);
    EXPECT_EQ(Flat(sent), expected);
    EXPECT_EQ(coordinator.Status().snapshots, 1)
        << "a gRPC response made the snapshot it needed, once";
  }
}

}  // namespace
}  // namespace dp
