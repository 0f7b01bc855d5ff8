// WeightsPublisher: the snapshots a coordinator hands out, on their own.
#include "server/weights_publisher.h"

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dp {
namespace {

std::vector<float> Decoded(absl::string_view bytes) {
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

TEST(WeightsPublisherTest, EachVersionIsEncodedOnceAndAHeldSnapshotStays) {
  WeightsPublisher w(3, Encoding::kF32, /*keep_previous=*/false);
  std::vector<float> params = {1, 2, 3};
  const WeightsPublisher::Snapshot first = w.Current(params);
  EXPECT_EQ(Decoded(first.bytes), params);
  EXPECT_EQ(w.Current(params).bytes.data(), first.bytes.data());
  EXPECT_EQ(w.snapshots_made(), 1);
  // An update while `first` is held (a response in flight): the next
  // snapshot is made elsewhere, and the held one keeps its bytes.
  w.BeforeUpdate(params);
  params = {4, 5, 6};
  const WeightsPublisher::Snapshot second = w.Current(params);
  EXPECT_NE(second.bytes.data(), first.bytes.data());
  EXPECT_EQ(Decoded(second.bytes), params);
  EXPECT_EQ(Decoded(first.bytes), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(w.snapshots_made(), 2);
  EXPECT_FALSE(w.holds_previous());  // not asked to keep it
}

TEST(WeightsPublisherTest, ShardedItHoldsTheVersionBeforeUntilAReset) {
  WeightsPublisher w(2, Encoding::kF32, /*keep_previous=*/true);
  std::vector<float> params = {7, 8};
  EXPECT_FALSE(w.holds_previous());
  w.BeforeUpdate(params);
  params = {9, 10};
  ASSERT_TRUE(w.holds_previous());
  EXPECT_EQ(Decoded(w.Previous().bytes), (std::vector<float>{7, 8}));
  EXPECT_EQ(Decoded(w.Current(params).bytes), params);
  w.Reset();
  EXPECT_FALSE(w.holds_previous());
  params = {11, 12};  // set back: the snapshot is made anew
  EXPECT_EQ(Decoded(w.Current(params).bytes), params);
}

}  // namespace
TEST(WeightsPublisherTest, AVersionIsServedIfItIsTheCurrentOrTheOneKept) {
  WeightsPublisher w(2, Encoding::kF32, /*keep_previous=*/true);
  std::vector<float> params = {1, 2};
  w.BeforeUpdate(params);
  params = {3, 4};
  // At version 5, holding 4: none asked and 5 are the current weights.
  for (std::optional<int64_t> asked : {std::optional<int64_t>(), {5}}) {
    absl::StatusOr<WeightsPublisher::Snapshot> got =
        w.Serve(0, asked, 5, params);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(Decoded(got->bytes), (std::vector<float>{3, 4}));
  }
  absl::StatusOr<WeightsPublisher::Snapshot> before = w.Serve(0, 4, 5, params);
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(Decoded(before->bytes), (std::vector<float>{1, 2}));
  // Older: the job moved on; later: this shard is behind the others (the
  // caller looks again, and its join rolls the shards back). Negative: no
  // version of this job.
  EXPECT_EQ(w.Serve(1, 3, 5, params).status().code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(w.Serve(1, 6, 5, params).status().code(),
            absl::StatusCode::kAborted);
  EXPECT_NE(w.Serve(1, 6, 5, params).status().message().find("behind"),
            absl::string_view::npos);
  EXPECT_EQ(w.Serve(1, -1, 5, params).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(w.Serve(1, 6, 5, params).status().message().find("rank 1"),
            absl::string_view::npos);
  // Without the one before (a rollback reset it), 4 is refused too.
  w.Reset();
  EXPECT_EQ(w.Serve(0, 4, 5, params).status().code(),
            absl::StatusCode::kAborted);
}

}  // namespace dp
