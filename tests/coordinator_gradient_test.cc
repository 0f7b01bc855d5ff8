// What the coordinator does with a gradient's values: decoded from bf16 or
// refused in another encoding, checked as they are read (a bad value names
// its rank, step and index and changes nothing), and added up in one order
// whatever the arrival order and the number of update threads.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "server/adam.h"
#include "server/coordinator_mirror.h"
#include "server/step_coordinator.h"
#include "tests/coordinator_harness.h"
#include "tests/same_state.h"

namespace dp {
namespace {

// A kTestWorld job of `layout` with gradients encoded as `e`, its update on
// `update_threads` threads, every rank registered.
std::unique_ptr<StepCoordinator> MakeCoordinator(const ModelLayout& layout,
                                                 Encoding e,
                                                 int update_threads) {
  CoordinatorSetup setup;
  setup.job.grad_encoding = e;
  setup.update_threads = update_threads;
  return MakeTestCoordinator(layout, setup);
}

TEST(StepCoordinatorTest, Bf16GradientsAreDecodedAndOtherEncodingsRefused) {
  const ModelLayout l = ModelLayout::Mlp({5, 7, 3});
  auto bf16 = MakeCoordinator(l, Encoding::kBf16, 1);
  auto f32 = MakeTestCoordinator(l);
  // Values exact in bf16: both jobs must take the identical step.
  std::vector<float> g(l.num_params());
  for (size_t i = 0; i < g.size(); ++i) g[i] = (int(i % 7) - 3) * 0.25f;
  std::string half(g.size() * 2, '\0');
  Encode(Encoding::kBf16, g.data(), g.size(), half.data());
  EXPECT_EQ(
      bf16->Push(0, 0, 0, WireBytes(g), 1.0f, Encoding::kF32).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f32->Push(0, 0, 0, half, 1.0f, Encoding::kBf16).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::string nan_half = half;
  nan_half[2 * 10 + 1] = static_cast<char>(0x7f);
  nan_half[2 * 10] = static_cast<char>(0xc0);
  auto nan = bf16->Push(0, 0, 0, nan_half, 1.0f, Encoding::kBf16);
  EXPECT_EQ(nan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(nan.status().message().find("index 10"), std::string::npos)
      << nan.status();
  for (int r = 0; r < kTestWorld; ++r) {
    ASSERT_TRUE(bf16->Push(r, 0, 0, half, 1.0f, Encoding::kBf16).ok());
    ASSERT_TRUE(f32->Push(r, 0, 0, WireBytes(g), 1.0f).ok());
  }
  EXPECT_TRUE(SameState(bf16->Snapshot(), f32->Snapshot()));
}

// The validator leaves a gradient's values alone: they are read once, here,
// as they are decoded into the rank's buffer.
TEST(StepCoordinatorTest, GradientValuesAreCheckedAsTheyAreDecoded) {
  const ModelLayout l = ModelLayout::Mlp({5, 7, 3});
  const int64_t last = l.num_params() - 1;
  for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::max(), -2 * kMaxAbsGradient}) {
    for (int64_t at : {int64_t{0}, last}) {
      auto c = MakeTestCoordinator(l);
      std::vector<float> g = TestGradient(l, 0, 0);
      g[at] = bad;
      const auto before = c->Observe();
      auto pushed = c->Push(0, 0, 0, WireBytes(g), 1.0f);
      EXPECT_EQ(pushed.status().code(), absl::StatusCode::kInvalidArgument)
          << bad << " at " << at;
      EXPECT_NE(pushed.status().message().find(absl::StrCat("index ", at)),
                std::string::npos)
          << pushed.status();
      EXPECT_EQ(ObservableDifferences(before, c->Observe()), "");
    }
  }
  auto c = MakeTestCoordinator(l);
  std::vector<float> g = TestGradient(l, 0, 0);
  g[last] = -kMaxAbsGradient;
  EXPECT_TRUE(c->Push(0, 0, 0, WireBytes(g), 1.0f).ok());
}

TEST(StepCoordinatorTest, LargestAcceptedGradientsKeepTheStateFinite) {
  const ModelLayout l = ModelLayout::Mlp({5, 7, 3});
  auto c = MakeTestCoordinator(l);
  for (int step = 0; step < 20; ++step) {
    for (int r = 0; r < kTestWorld; ++r) {
      // Alternating signs make m swing between the extremes.
      std::vector<float> g(l.num_params(),
                           (step + r) % 2 ? kMaxAbsGradient : -kMaxAbsGradient);
      ASSERT_TRUE(c->Push(r, step, 0, WireBytes(g), 1e15f).ok());
    }
  }
  const TrainingState s = c->Snapshot();
  ASSERT_EQ(s.step, 20);
  for (const auto* x : {&s.params, &s.m, &s.v}) {
    EXPECT_TRUE(std::all_of(x->begin(), x->end(),
                            [](float f) { return std::isfinite(f); }));
  }
}

// The gradient of the next rank to fold is added to the rank sum as it is
// read, with those of the ranks after it that came early (kept until
// then): every arrival order gives the bits of the rank-ordered sum, in
// either encoding, with an update pool.
TEST(StepCoordinatorTest, EveryArrivalOrderGivesTheBitsOfTheRankOrderedSum) {
  const ModelLayout l = ModelLayout::Mlp({40, 50, 10});  // five blocks
  for (Encoding e : {Encoding::kF32, Encoding::kBf16}) {
    SCOPED_TRACE(EncodingName(e));
    std::vector<int> order = {0, 1, 2};
    std::optional<TrainingState> in_rank_order;
    do {
      auto c = MakeCoordinator(l, e, 3);
      for (int step = 0; step < 3; ++step) {
        for (int r : order) {
          ASSERT_TRUE(PushGradient(*c, r, step, e).ok());
        }
      }
      EXPECT_EQ(c->Snapshot().step, 3);
      if (!in_rank_order.has_value()) {
        in_rank_order = c->Snapshot();
      } else {
        EXPECT_TRUE(SameState(*in_rank_order, c->Snapshot()))
            << order[0] << order[1] << order[2];
      }
    } while (std::next_permutation(order.begin(), order.end()));
  }
}

// What Observe() shows as the blocks come: a block whose sibling is not in
// keeps its sum (as read: bf16 decoded); the one that completes a sibling
// pair adds itself to it, and up the tree.
TEST(StepCoordinatorTest, SumsWaitForTheirSiblingsAndAreAddedWithThem) {
  const ModelLayout l = ModelLayout::Mlp({40, 50, 10});
  const Encoding e = Encoding::kBf16;
  auto c = MakeCoordinator(l, e, 3);
  std::vector<std::vector<float>> read;
  for (int r = 0; r < kTestWorld; ++r)
    read.push_back(AsRead(TestGradient(l, r, 0), e));
  ASSERT_TRUE(PushGradient(*c, 2, 0, e).ok());
  auto o = c->Observe();
  ASSERT_EQ(SumBlocks(o), (std::vector<Block>{{2, 1}}));
  EXPECT_TRUE(SameBits(o.sums[0].second, read[2]));
  ASSERT_TRUE(PushGradient(*c, 0, 0, e).ok());
  o = c->Observe();
  ASSERT_EQ(SumBlocks(o), (std::vector<Block>{{0, 1}, {2, 1}}))
      << "micro-batch 0 waits for 1";
  EXPECT_TRUE(SameBits(o.sums[0].second, read[0]));
  EXPECT_TRUE(SameBits(o.sums[1].second, read[2]));
  // Micro-batch 1 makes [0,2) and the root, and the step is applied: the
  // same state as the sum made one push at a time.
  auto reference = MakeCoordinator(l, e, 1);
  PushStep(*reference, 0, e);
  ASSERT_TRUE(PushGradient(*c, 1, 0, e).ok());
  EXPECT_TRUE(c->Observe().sums.empty()) << "the step is applied: a new sum";
  EXPECT_TRUE(SameState(c->Snapshot(), reference->Snapshot()));
}

// A bad value anywhere in the gradient of the next rank to fold - rank 0
// or a later one, with a kept gradient after it - is refused like one in a
// gradient that is kept: the error names the rank, the step, the value and
// its index, and the sum, the kept gradients and everything else are as
// before.
TEST(StepCoordinatorTest, ABadValueInAGradientAddedAsItIsReadChangesNothing) {
  const float bad_values[] = {std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(),
                              -2 * kMaxAbsGradient};
  for (Encoding e : {Encoding::kF32, Encoding::kBf16}) {
    for (int threads : {1, 3}) {
      for (int bad_rank : {0, 1}) {
        SCOPED_TRACE(testing::Message() << EncodingName(e) << ", " << threads
                                        << " threads, rank " << bad_rank);
        const ModelLayout l = threads == 1 ? ModelLayout::Mlp({5, 7, 3})
                                           : ModelLayout::Mlp({40, 50, 10});
        auto c = MakeCoordinator(l, e, threads);
        auto clean = MakeCoordinator(l, e, threads);
        // Rank 2 came early: its gradient is kept.
        for (int r : {bad_rank == 0 ? 1 : 0, 2}) {
          for (auto* k : {c.get(), clean.get()}) {
            ASSERT_TRUE(PushGradient(*k, r, 0, e).ok());
          }
        }
        const auto before = c->Observe();
        for (int64_t at = 0; at < l.num_params(); ++at) {
          std::vector<float> g = TestGradient(l, bad_rank, 0);
          g[at] = bad_values[at % 4];
          const std::string wire = WireBytes(g, e);
          const auto pushed = c->Push(bad_rank, 0, 0, wire, 1.0f, e);
          ASSERT_EQ(pushed.status().code(), absl::StatusCode::kInvalidArgument)
              << "at " << at << ": " << pushed.status();
          const std::string message(pushed.status().message());
          float read;
          Decode(e, wire.data() + at * BytesPerValue(e), 1, &read);
          for (const std::string& part :
               {absl::StrCat("rank ", bad_rank, " "), std::string("step 0 "),
                absl::StrFormat("(%g, limit", read),
                absl::StrCat("index ", at)}) {
            ASSERT_NE(message.find(part), std::string::npos)
                << "no '" << part << "' in: " << message;
          }
          ASSERT_EQ(ObservableDifferences(before, c->Observe()), "")
              << "at " << at;
        }
        for (auto* k : {c.get(), clean.get()}) {
          ASSERT_TRUE(PushGradient(*k, bad_rank, 0, e).ok());
        }
        EXPECT_EQ(c->Snapshot().step, 1);
        EXPECT_TRUE(SameState(c->Snapshot(), clean->Snapshot()));
      }
    }
  }
}

}  // namespace
}  // namespace dp
