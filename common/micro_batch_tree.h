// The fixed binary tree over a step's K micro-batches, in which their
// gradients are summed: node [lo, hi) of n micro-batches splits into its
// first ceil(n/2) and the rest, so a node's shape depends on its size only
// and workers' blocks stay even for any K. Its nodes are the
// aligned blocks a worker may be given: it sums its block's micro-batches
// in the same tree and pushes one tensor. Float addition is commutative, so
// a node's sum does not depend on which child arrived first, and the root
// does not depend on who computed which block: only on K and the
// micro-batches' gradients.
#ifndef DP_COMMON_MICRO_BATCH_TREE_H_
#define DP_COMMON_MICRO_BATCH_TREE_H_

#include <string>
#include <vector>

#include "absl/types/span.h"

namespace dp {

// Micro-batches [first, first + count) of a step; count 0 is no block.
struct Block {
  int first = 0;
  int count = 0;
  int end() const { return first + count; }
  bool empty() const { return count == 0; }
  bool Contains(const Block& b) const {
    return first <= b.first && b.end() <= end();
  }
  bool operator==(const Block& o) const {
    return first == o.first && count == o.count;
  }
  bool operator!=(const Block& o) const { return !(*this == o); }
  bool operator<(const Block& o) const {
    return first != o.first ? first < o.first : count > o.count;
  }
  std::string ToString() const;  // "[2,4)"
};

// Size of the left child of a node of `count` micro-batches (count >= 2).
int LeftChildSize(int count);
// [0, k): the whole step.
inline Block Root(int k) { return Block{0, k}; }
// True when `b` is a node of the tree over [0, k).
bool IsNode(int k, const Block& b);
// The node's parent and its sibling (b a node, not the root).
Block Parent(int k, const Block& b);
Block Sibling(int k, const Block& b);

// `workers` blocks (k when workers > k; none when workers < 1) covering
// [0, k), in micro-batch order: the root split, largest node first (ties:
// leftmost), until there are enough. Every block is a node; the largest is at
// most twice the smallest, plus one.
std::vector<Block> SplitForWorkers(int k, int workers);

// Sums the gradients of a block's micro-batches in tree order, given in
// micro-batch order: out = tree sum of leaves[0..count) (each n floats),
// The leaves are overwritten with partial sums; out may be leaves[0].
void SumInTreeOrder(absl::Span<float* const> leaves, int64_t n, float* out);

}  // namespace dp

#endif  // DP_COMMON_MICRO_BATCH_TREE_H_
