// The micro-batch tree: its nodes, the blocks workers are given, and sums
// that do not depend on who added which block.
#include "common/micro_batch_tree.h"

#include <cmath>
#include <functional>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "tests/same_state.h"

namespace dp {
namespace {

// Every node of the tree over [0, k), by the definition: the first half
// (rounded up) and the rest.
std::set<std::pair<int, int>> AllNodes(int k) {
  std::set<std::pair<int, int>> nodes;
  std::function<void(int, int)> walk = [&](int lo, int n) {
    nodes.insert({lo, n});
    if (n == 1) return;
    const int p = (n + 1) / 2;
    walk(lo, p);
    walk(lo + p, n - p);
  };
  walk(0, k);
  return nodes;
}

TEST(MicroBatchTreeTest, IsNodeAcceptsExactlyTheTreesNodes) {
  for (int k = 1; k <= 17; ++k) {
    const auto nodes = AllNodes(k);
    for (int first = -1; first <= k; ++first) {
      for (int count = 0; count <= k + 1; ++count) {
        EXPECT_EQ(IsNode(k, Block{first, count}),
                  nodes.count({first, count}) == 1)
            << "k " << k << " block " << Block{first, count}.ToString();
      }
    }
  }
}

TEST(MicroBatchTreeTest, ParentAndSiblingMakeTheParent) {
  for (int k = 2; k <= 17; ++k) {
    for (const auto& [first, count] : AllNodes(k)) {
      const Block b{first, count};
      if (b == Root(k)) continue;
      const Block p = Parent(k, b);
      const Block s = Sibling(k, b);
      EXPECT_TRUE(IsNode(k, p) && IsNode(k, s));
      EXPECT_EQ(std::min(b.first, s.first), p.first);
      EXPECT_EQ(b.count + s.count, p.count);
      EXPECT_EQ(Sibling(k, s), b);
    }
  }
}

TEST(MicroBatchTreeTest, WorkersGetNodesThatTileTheStep) {
  EXPECT_EQ(SplitForWorkers(2, 1), (std::vector<Block>{{0, 2}}));
  EXPECT_TRUE(SplitForWorkers(2, 0).empty());
  EXPECT_EQ(SplitForWorkers(4, 3),
            (std::vector<Block>{{0, 1}, {1, 1}, {2, 2}}));
  EXPECT_EQ(SplitForWorkers(4, 9),
            (std::vector<Block>{{0, 1}, {1, 1}, {2, 1}, {3, 1}}));
  for (int k = 1; k <= 20; ++k) {
    for (int w = 1; w <= 24; ++w) {
      const std::vector<Block> blocks = SplitForWorkers(k, w);
      ASSERT_EQ(static_cast<int>(blocks.size()), std::min(k, w));
      int next = 0, smallest = k, largest = 0;
      for (const Block& b : blocks) {
        EXPECT_TRUE(IsNode(k, b)) << b.ToString();
        EXPECT_EQ(b.first, next) << "k " << k << " w " << w;
        next = b.end();
        smallest = std::min(smallest, b.count);
        largest = std::max(largest, b.count);
      }
      EXPECT_EQ(next, k);
      EXPECT_LE(largest, 2 * smallest + 1) << "k " << k << " w " << w;
    }
  }
}

// Values whose float sums depend on the order they are added in.
std::vector<std::vector<float>> Leaves(int k, int n) {
  std::vector<std::vector<float>> leaves(k, std::vector<float>(n));
  for (int j = 0; j < k; ++j) {
    for (int i = 0; i < n; ++i) {
      const float scale = j % 3 == 0 ? 1e7f : 1.0f;
      leaves[j][i] = scale * std::sin(0.7f * i + 1.3f * j) + 0.1f * j;
    }
  }
  return leaves;
}

std::vector<float> TreeSum(std::vector<std::vector<float>> leaves, int first,
                           int count, int n) {
  std::vector<float*> p;
  for (int j = first; j < first + count; ++j) p.push_back(leaves[j].data());
  std::vector<float> out(n);
  SumInTreeOrder(p, n, out.data());
  return out;
}

// SumInTreeOrder against the tree written out by hand (docs/elastic.md),
// leaf by leaf: a reference that does not come from the code under test.
// A node's shape depends on its size only, so leaves 3 to 5 sum as 0 to 2.
TEST(MicroBatchTreeTest, TreeSumsAreTheDocumentedOrder) {
  constexpr int n = 257;
  const auto g = Leaves(6, n);
  auto by_hand = [&](auto expression) {
    std::vector<float> out(n);
    for (int i = 0; i < n; ++i) out[i] = expression(i);
    return out;
  };
  const std::vector<float> k3 =
      by_hand([&](int i) { return (g[0][i] + g[1][i]) + g[2][i]; });
  const std::vector<float> k5 = by_hand([&](int i) {
    return ((g[0][i] + g[1][i]) + g[2][i]) + (g[3][i] + g[4][i]);
  });
  EXPECT_TRUE(SameBits(TreeSum(g, 0, 1, n), g[0]));
  EXPECT_TRUE(SameBits(TreeSum(g, 0, 2, n),
                       by_hand([&](int i) { return g[0][i] + g[1][i]; })));
  EXPECT_TRUE(SameBits(TreeSum(g, 0, 3, n), k3));
  EXPECT_TRUE(SameBits(TreeSum(g, 0, 4, n), by_hand([&](int i) {
                         return (g[0][i] + g[1][i]) + (g[2][i] + g[3][i]);
                       })));
  EXPECT_TRUE(SameBits(TreeSum(g, 0, 5, n), k5));
  EXPECT_TRUE(SameBits(TreeSum(g, 0, 6, n), by_hand([&](int i) {
                         return ((g[0][i] + g[1][i]) + g[2][i]) +
                                ((g[3][i] + g[4][i]) + g[5][i]);
                       })));
  EXPECT_TRUE(SameBits(TreeSum(g, 3, 3, n), by_hand([&](int i) {
                         return (g[3][i] + g[4][i]) + g[5][i];
                       })));
  // The values tell these trees from their mirror images and from the
  // floor split, so the checks above can fail.
  EXPECT_FALSE(SameBits(
      k3, by_hand([&](int i) { return (g[2][i] + g[1][i]) + g[0][i]; })));
  EXPECT_FALSE(SameBits(
      k3, by_hand([&](int i) { return g[0][i] + (g[1][i] + g[2][i]); })));
  EXPECT_FALSE(SameBits(k5, by_hand([&](int i) {
                          return (g[0][i] + g[1][i]) +
                                 (g[2][i] + (g[3][i] + g[4][i]));
                        })));
}

// The property elasticity rests on: the sum of a node's children's sums,
// each made by whoever, is the node's sum, so every split of the step into
// blocks gives the root's bits; adding the leaves one after another does
// not.
TEST(MicroBatchTreeTest, BlocksSummedApartAddUpToTheSameBits) {
  constexpr int n = 257;
  for (int k = 1; k <= 12; ++k) {
    const auto leaves = Leaves(k, n);
    const std::vector<float> root = TreeSum(leaves, 0, k, n);
    for (int w = 1; w <= k; ++w) {
      // Each block's sum alone, then the blocks put back up the tree.
      std::vector<std::pair<Block, std::vector<float>>> sums;
      for (const Block& b : SplitForWorkers(k, w)) {
        sums.push_back({b, TreeSum(leaves, b.first, b.count, n)});
      }
      while (sums.size() > 1) {
        bool merged = false;
        for (size_t i = 0; i + 1 < sums.size() && !merged; ++i) {
          if (Sibling(k, sums[i].first) != sums[i + 1].first) continue;
          std::vector<float> parent(n);
          // The right child first: a + b == b + a.
          for (int v = 0; v < n; ++v) {
            parent[v] = sums[i + 1].second[v] + sums[i].second[v];
          }
          sums[i] = {Parent(k, sums[i].first), parent};
          sums.erase(sums.begin() + i + 1);
          merged = true;
        }
        ASSERT_TRUE(merged) << "k " << k << " w " << w;
      }
      EXPECT_TRUE(SameBits(sums[0].second, root)) << "k " << k << " w " << w;
    }
  }
  const auto leaves = Leaves(4, n);
  std::vector<float> in_a_row(n, 0.0f);
  for (int j = 0; j < 4; ++j) {
    for (int v = 0; v < n; ++v) in_a_row[v] += leaves[j][v];
  }
  EXPECT_FALSE(SameBits(in_a_row, TreeSum(leaves, 0, 4, n)))
      << "the values do not tell the two orders apart";
}

}  // namespace
}  // namespace dp
