"""The fixed binary tree over a step's K micro-batches, a port of
common/micro_batch_tree.{h,cc}: node [lo, lo+n) splits into its first
ceil(n/2) micro-batches and the rest. A worker sums its block's
micro-batch gradients in this tree, so the sum is dp-worker's to the bit."""

from collections import namedtuple

Block = namedtuple("Block", "first count")


def left_child_size(count):
    return (count + 1) // 2


def _child_towards(node, first):
    left = left_child_size(node.count)
    if first < node.first + left:
        return Block(node.first, left)
    return Block(node.first + left, node.count - left)


def is_node(k, b):
    """True when block `b` is a node of the tree over [0, k)."""
    if k < 1 or b.count < 1 or b.first < 0 or b.first + b.count > k:
        return False
    node = Block(0, k)
    while node.count > b.count:
        node = _child_towards(node, b.first)
    return node == b


def split_for_workers(k, workers):
    """`workers` blocks (k at most) covering [0, k): the largest node split
    first (ties: leftmost), as dp-ps plans a step."""
    if workers < 1:
        return []
    blocks = [Block(0, k)]
    while len(blocks) < min(k, workers):
        i = max(range(len(blocks)), key=lambda j: (blocks[j].count, -j))
        node = blocks[i]
        left = left_child_size(node.count)
        blocks[i:i + 1] = [Block(node.first, left),
                           Block(node.first + left, node.count - left)]
    return blocks


def sum_in_tree_order(leaves):
    """The tree sum of a block's micro-batch gradients (float32 tensors, in
    micro-batch order). Element-wise float32 additions in the C++ order:
    the same bits as SumInTreeOrder."""
    if len(leaves) == 1:
        return leaves[0]
    left = left_child_size(len(leaves))
    return sum_in_tree_order(leaves[:left]) + sum_in_tree_order(leaves[left:])
