// SumTree on its own: the tree's sums have the bits of the tree's additions
// written out by hand, whatever order the blocks come in, and a refused
// push changes nothing.
#include "server/sum_tree.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dp {
namespace {

constexpr int64_t kN = 4;
constexpr float kLimit = 1e6f;

std::string Encoded(const std::vector<float>& v) {
  std::string bytes(v.size() * sizeof(float), '\0');
  std::memcpy(bytes.data(), v.data(), bytes.size());
  return bytes;
}

// Values whose sums round differently in another order.
std::vector<float> Leaf(int j) {
  return {1e-3f * (j + 1), 1.0f / (j + 3), 3.0f + 1e-7f * j, -0.1f * j};
}

bool Push(SumTree& tree, const Block& block, const std::vector<float>& g) {
  SumTree::Folding folding;
  const SumTree::BadValue bad =
      tree.Read(block, Encoding::kF32, Encoded(g), kLimit, nullptr, &folding);
  if (bad.index >= 0) return false;
  tree.Accept(block, folding, 0.5f);
  return true;
}

std::vector<float> Root(const SumTree& tree) {
  return std::vector<float>(tree.root(), tree.root() + kN);
}

TEST(SumTreeTest, ThreeLeavesInAnyOrderAreTheTreesSum) {
  // K = 3 splits into {0, 1} and {2}: (g0 + g1) + g2, value by value.
  std::vector<float> expected(kN);
  for (int i = 0; i < kN; ++i) {
    expected[i] = (Leaf(0)[i] + Leaf(1)[i]) + Leaf(2)[i];
  }
  for (const std::vector<int>& order :
       {std::vector<int>{0, 1, 2}, {2, 1, 0}, {1, 2, 0}, {2, 0, 1}}) {
    SumTree tree(3, kN);
    for (int j : order) {
      EXPECT_FALSE(tree.complete());
      ASSERT_TRUE(Push(tree, Block{j, 1}, Leaf(j)));
    }
    ASSERT_TRUE(tree.complete());
    EXPECT_EQ(std::memcmp(Root(tree).data(), expected.data(), kN * 4), 0);
    EXPECT_EQ(tree.root_loss(), 1.5f);  // three leaves' 0.5
  }
}

TEST(SumTreeTest, FiveLeavesAsBlocksGiveTheSameBitsAsLeaves) {
  // K = 5: {0, 1, 2} = (g0 + g1) + g2 and {3, 4} = g3 + g4.
  std::vector<float> expected(kN), left(kN), right(kN);
  for (int i = 0; i < kN; ++i) {
    left[i] = (Leaf(0)[i] + Leaf(1)[i]) + Leaf(2)[i];
    right[i] = Leaf(3)[i] + Leaf(4)[i];
    expected[i] = left[i] + right[i];
  }
  SumTree leaves(5, kN);
  for (int j : {4, 0, 3, 2, 1}) ASSERT_TRUE(Push(leaves, Block{j, 1}, Leaf(j)));
  SumTree blocks(5, kN);
  ASSERT_TRUE(Push(blocks, Block{3, 2}, right));
  EXPECT_TRUE(blocks.Covered(Block{4, 1}));
  EXPECT_FALSE(blocks.Covered(Block{2, 1}));
  ASSERT_TRUE(Push(blocks, Block{0, 3}, left));
  ASSERT_TRUE(leaves.complete() && blocks.complete());
  EXPECT_EQ(std::memcmp(Root(leaves).data(), expected.data(), kN * 4), 0);
  EXPECT_EQ(std::memcmp(Root(blocks).data(), expected.data(), kN * 4), 0);
}

TEST(SumTreeTest, ARefusedPushLeavesTheSumsAsTheyWere) {
  SumTree tree(2, kN);
  ASSERT_TRUE(Push(tree, Block{0, 1}, Leaf(0)));
  const auto before = tree.Sums();
  std::vector<float> bad = Leaf(1);
  bad[2] = std::nanf("");
  SumTree::Folding folding;
  const SumTree::BadValue v = tree.Read(
      Block{1, 1}, Encoding::kF32, Encoded(bad), kLimit, nullptr, &folding);
  EXPECT_EQ(v.index, 2);
  EXPECT_TRUE(std::isnan(v.value));
  EXPECT_EQ(tree.Sums(), before);
  EXPECT_FALSE(tree.complete());
  // Checked only (a push that cannot count): the same verdict, no trace.
  EXPECT_EQ(tree.Check(Encoding::kF32, Encoded(bad), kLimit).index, 2);
  EXPECT_EQ(tree.Sums(), before);
  // The good push after it completes the tree from the sum that was kept.
  ASSERT_TRUE(Push(tree, Block{1, 1}, Leaf(1)));
  std::vector<float> expected(kN);
  for (int i = 0; i < kN; ++i) expected[i] = Leaf(0)[i] + Leaf(1)[i];
  EXPECT_EQ(std::memcmp(Root(tree).data(), expected.data(), kN * 4), 0);
  // A new step starts empty.
  tree.Clear();
  EXPECT_TRUE(tree.empty());
  EXPECT_FALSE(tree.Covered(Block{0, 1}));
}

}  // namespace
}  // namespace dp
