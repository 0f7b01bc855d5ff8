// A small deterministic random generator (SplitMix64), identical on every
// platform and compiler, so that weights, data order and synthetic data are
// pure functions of the seed.
#ifndef DP_COMMON_RANDOM_H_
#define DP_COMMON_RANDOM_H_

#include <cstdint>
#include <vector>

namespace dp {

class Rng {
 public:
  // Independent streams for the same seed, e.g. one per tensor or per epoch.
  Rng(uint64_t seed, uint64_t stream);

  uint64_t NextU64();
  // Uniform in [0, 1) with 53 random bits.
  double Uniform();
  // Uniform integer in [0, n), unbiased. n > 0.
  uint64_t Below(uint64_t n);
  // Standard normal (Box-Muller).
  double Normal();

 private:
  uint64_t state_;
};

// A uniformly random permutation of [0, n) (Fisher-Yates).
std::vector<int32_t> RandomPermutation(Rng& rng, int64_t n);

}  // namespace dp

#endif  // DP_COMMON_RANDOM_H_
