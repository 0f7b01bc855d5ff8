// The sums of a step's micro-batch tree.
#include "server/sum_tree.h"

#include "absl/container/inlined_vector.h"
#include "server/adam.h"

namespace dp {

SumTree::SumTree(int k, int64_t n) : k_(k), n_(n) { spare_ = FreeBuffer(); }

int SumTree::FreeBuffer() {
  if (!free_.empty()) {
    const int b = free_.back();
    free_.pop_back();
    return b;
  }
  buffers_.emplace_back(n_);
  return static_cast<int>(buffers_.size()) - 1;
}

void SumTree::Drop(const Block& b) {
  auto it = sums_.find(b);
  if (it == sums_.end()) return;
  free_.push_back(it->second.buffer);
  sums_.erase(it);
}

bool SumTree::Covered(const Block& b) const {
  auto it = sums_.upper_bound(Block{b.first, 0});
  if (it == sums_.begin()) return false;
  --it;
  return it->first.Contains(b);
}

SumTree::BadValue SumTree::Read(const Block& block, Encoding encoding,
                                absl::string_view gradient, float limit,
                                WorkerPool* pool, Folding* folding) {
  folding->top = block;
  folding->folded.clear();
  while (folding->top.count < k_) {
    const Block sibling = Sibling(k_, folding->top);
    if (sums_.find(sibling) == sums_.end()) break;
    folding->folded.push_back(sibling);
    folding->top = Parent(k_, folding->top);
  }
  float* copy = buffers_[spare_].data();
  absl::InlinedVector<const float*, 8> kept;
  for (size_t i = 1; i < folding->folded.size(); ++i) {
    kept.push_back(buffers_[sums_[folding->folded[i]].buffer].data());
  }
  const float* first = folding->folded.empty()
                           ? nullptr
                           : buffers_[sums_[folding->folded[0]].buffer].data();
  const int64_t bad = AddEncodedToSum(encoding, gradient.data(), n_, limit,
                                      first, kept, copy, pool);
  return BadValue{bad, bad >= 0 ? copy[bad] : 0.0f};
}

SumTree::BadValue SumTree::Check(Encoding encoding, absl::string_view gradient,
                                 float limit) {
  scratch_.resize(n_);
  const int64_t bad =
      DecodeChecked(encoding, gradient.data(), n_, limit, scratch_.data());
  return BadValue{bad, bad >= 0 ? scratch_[bad] : 0.0f};
}

void SumTree::Accept(const Block& block, const Folding& folding, float loss) {
  float loss_sum = loss * static_cast<float>(block.count);
  for (const Block& b : folding.folded) {
    loss_sum += sums_[b].loss;
    Drop(b);
  }
  for (auto it = sums_.lower_bound(Block{block.first, block.count});
       it != sums_.end() && block.Contains(it->first);) {
    free_.push_back(it->second.buffer);
    it = sums_.erase(it);
  }
  sums_[folding.top] = Sum{spare_, loss_sum};
  spare_ = FreeBuffer();
}

bool SumTree::complete() const { return sums_.count(Root(k_)) > 0; }

const float* SumTree::root() const {
  return buffers_[sums_.at(Root(k_)).buffer].data();
}

float SumTree::root_loss() const { return sums_.at(Root(k_)).loss; }

void SumTree::Clear() {
  for (auto& [block, sum] : sums_) free_.push_back(sum.buffer);
  sums_.clear();
}

std::vector<std::pair<Block, std::vector<float>>> SumTree::Sums() const {
  std::vector<std::pair<Block, std::vector<float>>> out;
  for (const auto& [block, sum] : sums_) {
    out.emplace_back(block, buffers_[sum.buffer]);
  }
  return out;
}

std::vector<float> SumTree::Losses() const {
  std::vector<float> out;
  for (const auto& [block, sum] : sums_) out.push_back(sum.loss);
  return out;
}

}  // namespace dp
