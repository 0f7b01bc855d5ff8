// SplitMix64-based deterministic random numbers.
#include "common/random.h"

#include <cmath>
#include <numeric>

namespace dp {
namespace {
uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ULL;
}  // namespace

Rng::Rng(uint64_t seed, uint64_t stream)
    : state_(Mix(Mix(seed + kGamma) ^ (stream * 0xd1b54a32d192ed03ULL + 1))) {}

uint64_t Rng::NextU64() {
  state_ += kGamma;
  return Mix(state_);
}

double Rng::Uniform() { return (NextU64() >> 11) * 0x1.0p-53; }

uint64_t Rng::Below(uint64_t n) {
  // Rejection sampling: drop the top partial range so every value is equally likely.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do {
    x = NextU64();
  } while (x >= limit);
  return x % n;
}

double Rng::Normal() {
  double u1 = Uniform();
  while (u1 <= 0.0) u1 = Uniform();
  const double u2 = Uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

std::vector<int32_t> RandomPermutation(Rng& rng, int64_t n) {
  std::vector<int32_t> p(n);
  std::iota(p.begin(), p.end(), 0);
  for (int64_t i = n - 1; i > 0; --i) {
    std::swap(p[i], p[rng.Below(i + 1)]);
  }
  return p;
}

}  // namespace dp
