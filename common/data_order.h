// The global data order (see README.md): for epoch e a permutation drawn
// from (seed, e), the global batch g is [g*B, (g+1)*B) of it with
// B = micro_batches * batch_size, micro-batch j is its j-th batch_size
// sub-slice (by default one per worker: rank r's), the last incomplete
// global batch is dropped. A micro-batch is a pure function of the step,
// so any process can compute any of them and resume at any step.
#ifndef DP_COMMON_DATA_ORDER_H_
#define DP_COMMON_DATA_ORDER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace dp {

struct Schedule {
  int64_t num_samples = 0;
  int world_size = 1;     // the most workers at once
  int batch_size = 1;     // samples per micro-batch
  int micro_batches = 0;  // per step; 0: world_size
  int epochs = 1;
  int64_t max_steps = 0;  // 0 = all epochs
  uint64_t seed = 0;
  bool shuffle = true;

  int num_micro_batches() const {
    return micro_batches > 0 ? micro_batches : world_size;
  }
  int64_t global_batch() const {
    return int64_t{num_micro_batches()} * batch_size;
  }
  int64_t steps_per_epoch() const { return num_samples / global_batch(); }
  // epochs * steps_per_epoch, capped by max_steps when that is > 0.
  int64_t total_steps() const;
  int epoch_of(int64_t step) const {
    return static_cast<int>(step / steps_per_epoch());
  }
  // True when `step` is the last step of an epoch (or of the job).
  bool ends_epoch(int64_t step) const;
  bool operator==(const Schedule& o) const {
    return num_samples == o.num_samples && world_size == o.world_size &&
           batch_size == o.batch_size &&
           num_micro_batches() == o.num_micro_batches() && epochs == o.epochs &&
           max_steps == o.max_steps && seed == o.seed && shuffle == o.shuffle;
  }
};

// INVALID_ARGUMENT naming the field when the schedule cannot run (no full
// global batch, non-positive sizes...).
absl::Status ValidateSchedule(const Schedule& s);

// The global sample order of `epoch`: a permutation of [0, n) drawn from
// (seed, epoch), or the identity when !shuffle.
std::vector<int32_t> EpochOrder(uint64_t seed, int64_t epoch, int64_t n,
                                bool shuffle);

// Sample indices of a micro-batch of a step; caches the current epoch's
// order.
class BatchSampler {
 public:
  explicit BatchSampler(Schedule schedule);
  // Returns the batch_size indices into the data set of micro-batch
  // `micro_batch` of `step`.
  absl::Span<const int32_t> Indices(int64_t step, int micro_batch);

 private:
  Schedule s_;
  int64_t cached_epoch_ = -1;
  std::vector<int32_t> order_;
};

}  // namespace dp

#endif  // DP_COMMON_DATA_ORDER_H_
