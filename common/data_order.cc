// Global data order as a pure function of (seed, epoch, step, rank).
#include "common/data_order.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "absl/strings/str_format.h"
#include "common/random.h"
#include "common/status_macros.h"

namespace dp {
namespace {
// Stream id space for epoch permutations, apart from the parameter-init
// streams.
constexpr uint64_t kOrderStream = 0x0de0'0000'0000'0000ULL;
}  // namespace

int64_t Schedule::total_steps() const {
  const int64_t all = int64_t{epochs} * steps_per_epoch();
  return max_steps > 0 ? std::min(all, max_steps) : all;
}

bool Schedule::ends_epoch(int64_t step) const {
  return (step + 1) % steps_per_epoch() == 0 || step + 1 == total_steps();
}

absl::Status ValidateSchedule(const Schedule& s) {
  // The fields with a lower bound, each named as its flag is.
  const struct {
    const char* name;
    int64_t value;
    int64_t min;
    const char* note;
  } bounded[] = {{"workers", s.world_size, 1, ""},
                 {"batch_size", s.batch_size, 1, ""},
                 {"micro_batches", s.micro_batches, 0, " (0: one per worker)"},
                 {"epochs", s.epochs, 1, ""},
                 {"max_steps", s.max_steps, 0, ""}};
  for (const auto& f : bounded) {
    if (f.value < f.min) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s must be >= %d%s, got %d", f.name, f.min, f.note, f.value));
    }
  }
  // Sample indices are int32 (EpochOrder).
  if (s.num_samples > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the data set has %d samples, more than the %d supported",
        s.num_samples, std::numeric_limits<int32_t>::max()));
  }
  if (s.num_samples < s.global_batch()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the data set has %d samples, fewer than one global batch of %d "
        "(%d micro-batches of batch_size %d; by default one per worker, "
        "workers %d)",
        s.num_samples, s.global_batch(), s.num_micro_batches(), s.batch_size,
        s.world_size));
  }
  return absl::OkStatus();
}

std::vector<int32_t> EpochOrder(uint64_t seed, int64_t epoch, int64_t n,
                                bool shuffle) {
  if (!shuffle) {
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    return order;
  }
  Rng rng(seed, kOrderStream + static_cast<uint64_t>(epoch));
  return RandomPermutation(rng, n);
}

BatchSampler::BatchSampler(Schedule schedule) : s_(schedule) {}

absl::Span<const int32_t> BatchSampler::Indices(int64_t step, int micro_batch) {
  DP_CHECK(micro_batch >= 0 && micro_batch < s_.num_micro_batches() &&
           step >= 0);
  const int64_t epoch = s_.epoch_of(step);
  if (epoch != cached_epoch_) {
    order_ = EpochOrder(s_.seed, epoch, s_.num_samples, s_.shuffle);
    cached_epoch_ = epoch;
  }
  const int64_t g = step % s_.steps_per_epoch();
  const int64_t begin =
      g * s_.global_batch() + int64_t{micro_batch} * s_.batch_size;
  return absl::MakeConstSpan(order_).subspan(begin, s_.batch_size);
}

}  // namespace dp
