// Tree shape and block planning; see micro_batch_tree.h.
#include "common/micro_batch_tree.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace dp {

std::string Block::ToString() const {
  return absl::StrFormat("[%d,%d)", first, end());
}

int LeftChildSize(int count) { return (count + 1) / 2; }

bool IsNode(int k, const Block& b) {
  if (k < 1 || b.count < 1 || b.first < 0 || b.end() > k) return false;
  Block node = Root(k);
  while (node.count > b.count) {
    const int left = LeftChildSize(node.count);
    node = b.first < node.first + left
               ? Block{node.first, left}
               : Block{node.first + left, node.count - left};
  }
  return node == b;
}

Block Parent(int k, const Block& b) {
  Block node = Root(k);
  Block parent = node;
  while (node != b) {
    DP_CHECK(node.count > 1);
    parent = node;
    const int left = LeftChildSize(node.count);
    node = b.first < node.first + left
               ? Block{node.first, left}
               : Block{node.first + left, node.count - left};
  }
  return parent;
}

Block Sibling(int k, const Block& b) {
  const Block p = Parent(k, b);
  const int left = LeftChildSize(p.count);
  return b.first == p.first ? Block{p.first + left, p.count - left}
                            : Block{p.first, left};
}

std::vector<Block> SplitForWorkers(int k, int workers) {
  if (workers < 1) return {};
  std::vector<Block> blocks = {Root(k)};
  while (static_cast<int>(blocks.size()) < std::min(k, workers)) {
    auto largest = std::max_element(
        blocks.begin(), blocks.end(),
        [](const Block& a, const Block& b) { return a.count < b.count; });
    const Block node = *largest;
    const int left = LeftChildSize(node.count);
    *largest = Block{node.first, left};
    blocks.insert(largest + 1, Block{node.first + left, node.count - left});
  }
  return blocks;
}

namespace {

// out = the tree sum of leaves [0, count), which form one node's leaves
// (count as a root of its own: the shape depends on the count only).
void SumNode(absl::Span<float* const> leaves, int64_t n, float* out) {
  if (leaves.size() == 1) {
    if (out != leaves[0]) std::memcpy(out, leaves[0], n * sizeof(float));
    return;
  }
  const int left = LeftChildSize(static_cast<int>(leaves.size()));
  // Each half into its first leaf's buffer: the leaves are the caller's
  // scratch, consumed by the sum.
  SumNode(leaves.subspan(0, left), n, leaves[0]);
  SumNode(leaves.subspan(left), n, leaves[left]);
  const float* a = leaves[0];
  const float* b = leaves[left];
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

}  // namespace

void SumInTreeOrder(absl::Span<float* const> leaves, int64_t n, float* out) {
  DP_CHECK(!leaves.empty());
  SumNode(leaves, n, out);
}

}  // namespace dp
