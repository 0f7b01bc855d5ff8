// The split of the parameter vector over shards: contiguous, covering,
// balanced by bytes, on tensor boundaries only where that keeps the balance.
#include "common/shard_plan.h"

#include <cstdlib>

#include "gtest/gtest.h"

namespace dp {
namespace {

bool IsTensorBoundary(const ModelLayout& layout, int64_t at) {
  if (at == 0 || at == layout.num_params()) return true;
  for (const TensorInfo& t : layout.tensors()) {
    if (t.offset == at) return true;
  }
  return false;
}

void ExpectAGoodSplit(const ModelLayout& layout, int shards) {
  SCOPED_TRACE(::testing::Message() << shards << " shards");
  const std::vector<ParamRange> r = ShardRanges(layout, shards);
  ASSERT_EQ(static_cast<int>(r.size()), shards);
  const int64_t n = layout.num_params();
  EXPECT_EQ(r.front().offset, 0);
  EXPECT_EQ(r.back().end(), n);
  for (int k = 0; k < shards; ++k) {
    EXPECT_GT(r[k].length, 0);
    if (k > 0) EXPECT_EQ(r[k].offset, r[k - 1].end());
    if (k == 0) continue;
    // Each cut: a 64-byte multiple next to k*n/S, or a tensor boundary
    // within 2% of a shard's share of it.
    const int64_t cut = r[k].offset;
    const int64_t ideal = n * k / shards;
    const bool aligned = cut % 16 == 0 && std::llabs(cut - ideal) < 16;
    const bool boundary = IsTensorBoundary(layout, cut) &&
                          std::llabs(cut - ideal) * 50 <= n / shards;
    EXPECT_TRUE(aligned || boundary) << "cut " << cut << ", ideal " << ideal;
  }
}

TEST(ShardPlanTest, SimpleNetSplitsEvenlyForEveryShardCount) {
  const ModelLayout layout = ModelLayout::SimpleNet();
  for (int s = 1; s <= kMaxShards; ++s) ExpectAGoodSplit(layout, s);
  // 2 shards: fc1.weight alone is 85% of the bytes, so the cut is inside it.
  const std::vector<ParamRange> two = ShardRanges(layout, 2);
  EXPECT_EQ(two[0].offset, 0);
  EXPECT_EQ(two[0].length, 117568);
  EXPECT_EQ(two[1].length, 117578);
}

TEST(ShardPlanTest, ACutNearATensorBoundaryMovesOntoIt) {
  // 100-100-100: weights of 10,000 values, biases of 100; the middle of the
  // 20,200 values (10,100) is exactly the start of layer 2's weight.
  const ModelLayout layout = ModelLayout::Mlp({100, 100, 100});
  const std::vector<ParamRange> two = ShardRanges(layout, 2);
  EXPECT_EQ(two[1].offset, layout.weight(1).offset);
  ExpectAGoodSplit(layout, 2);
  for (int s = 3; s <= 8; ++s) ExpectAGoodSplit(layout, s);
  // 100-100-102: 20,402 values, the middle (10,201) is 101 values past the
  // boundary at 10,100, within 2% of a share: the cut moves onto it.
  const ModelLayout near = ModelLayout::Mlp({100, 100, 102});
  ASSERT_EQ(near.num_params(), 20402);
  ASSERT_EQ(near.weight(1).offset, 10100);
  EXPECT_EQ(ShardRanges(near, 2)[1].offset, 10100);
  ExpectAGoodSplit(near, 2);
}

// What a worker may read in place from one shard: the tensors wholly inside
// its range, never a piece of one that another shard holds the rest of.
TEST(ShardPlanTest, WholeTensorsAreTheTensorsThatLieWhollyInARange) {
  const ModelLayout layout = ModelLayout::SimpleNet();
  const int64_t n = layout.num_params();
  EXPECT_EQ(WholeTensors(layout, ParamRange{0, n}), (ParamRange{0, n}));
  // 2 shards: the cut lies inside fc1.weight, which neither holds whole.
  const std::vector<ParamRange> two = ShardRanges(layout, 2);
  EXPECT_EQ(WholeTensors(layout, two[0]).length, 0);
  EXPECT_EQ(WholeTensors(layout, two[1]),
            (ParamRange{layout.bias(0).offset, n - layout.bias(0).offset}));
  // A range from inside fc1.bias to inside fc3.weight: fc2.weight, fc2.bias.
  const ParamRange inner{layout.bias(0).offset + 1,
                         layout.weight(2).offset + 5 - layout.bias(0).offset};
  EXPECT_EQ(WholeTensors(layout, inner),
            (ParamRange{layout.weight(1).offset,
                        layout.weight(2).offset - layout.weight(1).offset}));
  // Exactly one tensor.
  EXPECT_EQ(WholeTensors(
                layout, ParamRange{layout.bias(1).offset, layout.bias(1).size}),
            (ParamRange{layout.bias(1).offset, layout.bias(1).size}));
  for (int s = 1; s <= kMaxShards; ++s) {
    for (const ParamRange& r : ShardRanges(layout, s)) {
      const ParamRange whole = WholeTensors(layout, r);
      EXPECT_GE(whole.offset, r.offset);
      EXPECT_LE(whole.end(), r.end());
      for (const TensorInfo& t : layout.tensors()) {
        const bool inside =
            t.offset >= r.offset && t.offset + t.size <= r.end();
        const bool covered = whole.length > 0 && t.offset >= whole.offset &&
                             t.offset + t.size <= whole.end();
        EXPECT_EQ(inside, covered) << t.name << " in [" << r.offset << ", "
                                   << r.end() << ") of " << s << " shards";
      }
    }
  }
}

TEST(ShardPlanTest, OutOfRangeShardsAreInvalidArgumentNamingTheFlags) {
  const ModelLayout layout = ModelLayout::SimpleNet();
  ShardSpec spec;
  for (auto [count, index] : std::vector<std::pair<int, int>>{
           {0, 0}, {kMaxShards + 1, 0}, {2, 2}, {2, -1}}) {
    const absl::Status s = MakeShardSpec(layout, count, index, &spec);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("--shard"), std::string::npos) << s;
  }
  ASSERT_TRUE(MakeShardSpec(layout, 3, 2, &spec).ok());
  EXPECT_EQ(spec.range.end(), layout.num_params());
  EXPECT_EQ(spec.ToString(), "shard 2 of 3 [156752, 235146)");
}

TEST(ShardPlanTest, AShardTemplateNamesEveryShard) {
  using List = std::vector<std::string>;
  EXPECT_EQ(
      *ExpandShardTemplate("dp-ps-{shard}.dp-ps:5000", 3),
      (List{"dp-ps-0.dp-ps:5000", "dp-ps-1.dp-ps:5000", "dp-ps-2.dp-ps:5000"}));
  EXPECT_EQ(*ExpandShardTemplate("a:1, b:2", 0), (List{"a:1", "b:2"}));
  EXPECT_EQ(*ExpandShardTemplate("", 2), List{});
  const auto no_count = ExpandShardTemplate("ps-{shard}:5000", 0);
  EXPECT_EQ(no_count.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(no_count.status().message().find("DP_SHARDS"), std::string::npos);
}

}  // namespace
}  // namespace dp
