// The sums of one step's micro-batch tree (common/micro_batch_tree.h) that
// are in: a push's gradient is read once, as it arrives, into a spare
// buffer and added there to the sum of its sibling and of the siblings up
// the tree that are in (one node's addition each: a + b, and a + b == b +
// a), so the root's sum has the same bits whoever computed which block and
// in what order they came. A push that is refused leaves no trace: the
// spare buffer is only a sum once Accept makes it one. Buffers are reused
// from step to step. A plain class with no ranks in it: StepCoordinator
// calls it under its mutex.
#ifndef DP_SERVER_SUM_TREE_H_
#define DP_SERVER_SUM_TREE_H_

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/micro_batch_tree.h"
#include "common/parallel_for.h"
#include "common/tensor_codec.h"

namespace dp {

class SumTree {
 public:
  // A tree of `k` micro-batches, of sums of `n` values.
  SumTree(int k, int64_t n);

  // Where a read push goes once accepted: the node the spare buffer then
  // holds, and the siblings in it.
  struct Folding {
    Block top;
    std::vector<Block> folded;
  };
  // A value that is not finite or exceeds the limit: where, and as read.
  struct BadValue {
    int64_t index = -1;  // -1: none
    float value = 0.0f;
  };

  // Reads `gradient` (n values encoded as `encoding`), a push of `block` (a
  // node), into the spare buffer, added to the sums that are in of its
  // sibling and of the siblings up the tree; *folding says where it goes.
  // Every value is read once and checked against `limit`. Requires
  // `gradient` to hold n values (the caller checks its shape).
  BadValue Read(const Block& block, Encoding encoding,
                absl::string_view gradient, float limit, WorkerPool* pool,
                Folding* folding);
  // Checks a push that cannot count, read once into scratch.
  BadValue Check(Encoding encoding, absl::string_view gradient, float limit);
  // Makes the spare buffer the sum of folding.top, with `loss` the mean
  // loss of `block`'s micro-batches, replacing the siblings folded into it
  // and any sums inside `block` (a block handed out again after parts of it
  // came in: the same values). Requires a Read of `block` just before.
  void Accept(const Block& block, const Folding& folding, float loss);

  bool empty() const { return sums_.empty(); }
  // `b` or a node around it is in.
  bool Covered(const Block& b) const;
  // The root is in: the step's whole sum.
  bool complete() const;
  // The root's sum and the sum of its micro-batches' mean losses. Requires
  // complete().
  const float* root() const;
  float root_loss() const;
  // A new step: no sums (the buffers are kept).
  void Clear();

  // The sums that are in, by block, with their loss sums: for the
  // coordinator's test mirror.
  std::vector<std::pair<Block, std::vector<float>>> Sums() const;
  std::vector<float> Losses() const;

 private:
  struct Sum {
    int buffer = 0;
    float loss = 0.0f;
  };
  int FreeBuffer();
  void Drop(const Block& b);

  const int k_;
  const int64_t n_;
  // Disjoint nodes: the one starting at or before a block's first
  // micro-batch is the only one that can hold it.
  std::map<Block, Sum> sums_;
  std::vector<std::vector<float>> buffers_;
  std::vector<int> free_;
  int spare_ = 0;               // where the next push is read
  std::vector<float> scratch_;  // where a push that cannot count is read
};

}  // namespace dp

#endif  // DP_SERVER_SUM_TREE_H_
