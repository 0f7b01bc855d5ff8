// What the coordinator serves and keeps: pulled weights as shared
// snapshots, the current weights without one, bf16 weights, the time spent
// reading and using them; a shard's range of the vector, its version
// before, and its rewind.
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/coordinator_mirror.h"
#include "server/step_coordinator.h"
#include "tests/coordinator_harness.h"
#include "tests/same_state.h"

namespace dp {
namespace {

TEST(StepCoordinatorTest, PulledWeightsAreASnapshotSharedUntilTheNextUpdate) {
  const ModelLayout l = ModelLayout::Mlp({5, 7, 3});
  auto c = MakeTestCoordinator(l);
  auto first = c->Pull(0, 0, 0);
  auto again = c->Pull(1, 0, 0);
  ASSERT_TRUE(first.ok() && again.ok());
  EXPECT_EQ(first->lease.get(), again->lease.get())
      << "one copy serves every rank";
  EXPECT_EQ(first->encoding, Encoding::kF32);
  const std::vector<float> before = PulledValues(*first);
  EXPECT_TRUE(SameBits(before, c->Snapshot().params));
  PushStep(*c, 0);
  // A response still being sent keeps the weights it was given.
  EXPECT_TRUE(SameBits(before, PulledValues(*first)));
  auto next = c->Pull(0, 2, 3);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->step, 1);
  EXPECT_NE(next->lease.get(), first->lease.get())
      << "a held snapshot is not reused";
  const std::vector<float> now = c->Snapshot().params;
  EXPECT_FALSE(SameBits(before, now));
  EXPECT_TRUE(SameBits(PulledValues(*next),
                       std::vector<float>(now.begin() + 2, now.begin() + 5)));
  // Released snapshots are reused: serving many steps allocates no more.
  const void* held = next->lease.get();
  first = again = next = absl::InternalError("released");
  std::set<const void*> buffers{held};
  for (int step = 1; step < 6; ++step) {
    PushStep(*c, step);
    auto w = c->Pull(0, 0, 0);
    ASSERT_TRUE(w.ok());
    buffers.insert(w->lease.get());
  }
  EXPECT_LE(buffers.size(), 2u);
}

// WithCurrentWeights hands out the params themselves, with no snapshot;
// Pull still makes one, once a version, when it is first asked.
TEST(StepCoordinatorTest, TheTimeOfReadingPushesAndUsingTheWeightsIsCounted) {
  const ModelLayout l = ModelLayout::Mlp({5, 7, 3});
  auto c = MakeTestCoordinator(l);
  EXPECT_EQ(c->Status().times.read_time, absl::ZeroDuration());
  EXPECT_EQ(c->Status().times.use_time, absl::ZeroDuration());
  PushStep(*c, 0);
  const absl::Duration read = c->Status().times.read_time;
  EXPECT_GT(read, absl::ZeroDuration());
  // A refused push was read too: its time counts.
  EXPECT_FALSE(PushGradient(*c, 0, 5).ok());
  EXPECT_GT(c->Status().times.read_time, read);
  const absl::Duration pause = absl::Milliseconds(2);
  ASSERT_TRUE(c->WithCurrentWeights(0, [&](int64_t, absl::Span<const float>) {
                 absl::SleepFor(pause);
               }).ok());
  EXPECT_GE(c->Status().times.use_time, pause);
}

TEST(StepCoordinatorTest, CurrentWeightsAreHandedOutWithoutASnapshot) {
  const ModelLayout l = ModelLayout::Mlp({5, 7, 3});
  auto c = MakeTestCoordinator(l);
  for (int step = 0; step < 2; ++step) {
    PushStep(*c, step);
    for (int r = 0; r < kTestWorld; ++r) {
      std::vector<float> seen;
      int64_t seen_step = -1;
      auto step_now = c->WithCurrentWeights(
          r, [&](int64_t s, absl::Span<const float> params) {
            seen_step = s;
            seen.assign(params.begin(), params.end());
          });
      ASSERT_TRUE(step_now.ok()) << step_now.status();
      EXPECT_EQ(step_now->step, step + 1);
      EXPECT_EQ(seen_step, step + 1);
      EXPECT_TRUE(SameBits(seen, c->Snapshot().params));
    }
  }
  EXPECT_EQ(c->Status().snapshots, 0);
  bool called = false;
  EXPECT_EQ(
      c->WithCurrentWeights(
           kTestWorld, [&](int64_t, absl::Span<const float>) { called = true; })
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(called);
  ASSERT_TRUE(c->Pull(0, 0, 0).ok());
  ASSERT_TRUE(c->Pull(1, 0, 0).ok());
  EXPECT_EQ(c->Status().snapshots, 1);
}

TEST(StepCoordinatorTest, Bf16WeightsAreTheFloat32WeightsRounded) {
  CoordinatorSetup bf16_weights;
  bf16_weights.job.weight_encoding = Encoding::kBf16;
  auto c = MakeTestCoordinator(ModelLayout::Mlp({5, 7, 3}), bf16_weights);
  PushStep(*c, 0);
  auto w = c->Pull(0, 1, 4);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->encoding, Encoding::kBf16);
  ASSERT_EQ(w->bytes.size(), 4u * 2);
  // dp-ps keeps float32: only what it sends is rounded.
  const std::vector<float> kept = c->Snapshot().params;
  std::string expected(4 * 2, '\0');
  Encode(Encoding::kBf16, kept.data() + 1, 4, expected.data());
  EXPECT_EQ(std::string(w->bytes), expected);
  EXPECT_FALSE(
      SameBits(PulledValues(*w),
               std::vector<float>(kept.begin() + 1, kept.begin() + 5)));
}

// The sharded tests' model.
const ModelLayout& Layout() {
  static const ModelLayout* l = new ModelLayout(ModelLayout::Mlp({40, 30, 10}));
  return *l;
}

// Shard `index` of `count` of Layout(), with its range of the same initial
// state as the others, every rank registered.
std::unique_ptr<StepCoordinator> MakeShard(int index, int count) {
  CoordinatorSetup setup;
  EXPECT_TRUE(MakeShardSpec(Layout(), count, index, &setup.shard).ok());
  return MakeTestCoordinator(Layout(), setup);
}

TEST(ShardedCoordinatorTest, ShardsComputeTheWholeVectorsUpdateToTheBit) {
  auto whole = MakeTestCoordinator(Layout());
  std::vector<std::unique_ptr<StepCoordinator>> shards;
  for (int k = 0; k < 3; ++k) shards.push_back(MakeShard(k, 3));
  for (int step = 0; step < 5; ++step) {
    PushStep(*whole, step);
    for (auto& s : shards) PushStep(*s, step);
  }
  const TrainingState w = whole->Snapshot();
  std::vector<float> params, m, v;
  for (auto& s : shards) {
    const TrainingState t = s->Snapshot();
    EXPECT_EQ(t.step, w.step);
    params.insert(params.end(), t.params.begin(), t.params.end());
    m.insert(m.end(), t.m.begin(), t.m.end());
    v.insert(v.end(), t.v.begin(), t.v.end());
  }
  EXPECT_TRUE(SameBits(params, w.params));
  EXPECT_TRUE(SameBits(m, w.m));
  EXPECT_TRUE(SameBits(v, w.v));
}

TEST(ShardedCoordinatorTest, RangesOutsideTheShardAreRefusedChangingNothing) {
  auto shard = MakeShard(1, 2);
  StepCoordinator& second = *shard;
  const ParamRange mine = second.shard().range;
  const auto before = second.Observe();
  // The whole vector, the first shard's range, a range across the cut.
  const std::vector<float> g = TestGradient(Layout(), 0, 0);
  EXPECT_EQ(second.Push(0, 0, 0, WireBytes(g), 1.0f).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      second.Push(0, 0, 0, WireBytes(std::vector<float>(mine.length)), 1.0f)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(second.Pull(0, mine.offset - 1, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(second.Pull(0, 0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A pull of the range: its values, length 0 meaning to its end.
  auto pulled = second.Pull(0, mine.offset, 0);
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(PulledValues(*pulled).size(), static_cast<size_t>(mine.length));
  auto observed = second.Observe();
  observed.last_seen = before.last_seen;  // the accepted pull renewed it
  EXPECT_EQ(ObservableDifferences(before, observed), "");
}

// Errors name a value by its index in the whole vector, whether the
// gradient is kept (rank 0) or added to the sum as it is read (rank 1).
TEST(ShardedCoordinatorTest, ABadValueIsNamedByItsIndexInTheWholeVector) {
  auto shard = MakeShard(1, 2);
  StepCoordinator& c = *shard;
  const ParamRange range = c.shard().range;
  for (int rank : {0, 1}) {
    const std::vector<float> g = TestGradient(Layout(), rank, 0);
    std::vector<float> mine(g.begin() + range.offset, g.begin() + range.end());
    mine[5] = std::numeric_limits<float>::quiet_NaN();
    const auto before = c.Observe();
    const absl::Status s =
        c.Push(rank, 0, range.offset, WireBytes(mine), 1.0f).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(absl::StrCat("index ", range.offset + 5)),
              std::string::npos)
        << s;
    EXPECT_EQ(ObservableDifferences(before, c.Observe()), "");
    ASSERT_TRUE(PushGradient(c, rank, 0).ok());
  }
}

TEST(ShardedCoordinatorTest, TheVersionBeforeIsServedAfterAnUpdate) {
  auto shard = MakeShard(0, 2);
  StepCoordinator& c = *shard;
  const ParamRange range = c.shard().range;
  EXPECT_FALSE(c.Status().holds_previous);
  EXPECT_EQ(c.Pull(0, range.offset, 0, int64_t{-1}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  const std::vector<float> v0 = PulledValues(*c.Pull(0, range.offset, 0));
  PushStep(c, 0);
  ASSERT_TRUE(c.Status().holds_previous);
  auto old = c.Pull(0, range.offset, 0, int64_t{0});
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->step, 0);
  EXPECT_TRUE(SameBits(PulledValues(*old), v0));
  auto now = c.Pull(0, range.offset, 0, int64_t{1});
  ASSERT_TRUE(now.ok());
  EXPECT_EQ(now->step, 1);
  EXPECT_FALSE(SameBits(PulledValues(*now), v0));
  EXPECT_EQ(c.Pull(0, range.offset, 0, int64_t{2}).status().code(),
            absl::StatusCode::kAborted);
}

TEST(ShardedCoordinatorTest, RewindRestoresAStateAndEndsTheWaits) {
  auto shard = MakeShard(1, 2);
  StepCoordinator& c = *shard;
  const ParamRange range = c.shard().range;
  const TrainingState at0 = c.Snapshot();
  PushStep(c, 0);
  PushStep(c, 1);
  // Rank 0 pushed step 2 and waits.
  ASSERT_TRUE(PushGradient(c, 0, 2).ok());
  absl::Status waited;
  auto ticket = c.WaitForStep(
      0, 2, [&](const absl::Status& s, int64_t, Block) { waited = s; });
  ASSERT_TRUE(ticket.ok() && !ticket->ready);

  // A rollback decided on another generation changes nothing.
  const uint64_t generation = c.Status().generation;
  const auto before = c.Observe();
  EXPECT_EQ(c.Rewind(generation + 1, at0).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(ObservableDifferences(before, c.Observe()), "");

  ASSERT_TRUE(c.Rewind(generation, at0).ok());
  EXPECT_EQ(waited.code(), absl::StatusCode::kAborted) << waited;
  EXPECT_TRUE(SameState(c.Snapshot(), at0));
  const CoordinatorStatus after = c.Status();
  EXPECT_NE(after.generation, generation);
  EXPECT_FALSE(after.holds_previous);
  EXPECT_TRUE(after.pushed_ranks.empty());
  // The steps again give the same state as the first time.
  PushStep(c, 0);
  EXPECT_EQ(c.Status().step, 1);
}

}  // namespace
}  // namespace dp
