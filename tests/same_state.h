// Bit-for-bit equality of float vectors and training states: what "nothing
// changed" and "the same model" mean in the tests (floats compared by
// their bytes, so that -0.0, +0.0 and NaNs count as what they are).
#ifndef DP_TESTS_SAME_STATE_H_
#define DP_TESTS_SAME_STATE_H_

#include <cstring>
#include <vector>

#include "common/job_config.h"

namespace dp {

inline bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline bool SameState(const TrainingState& a, const TrainingState& b) {
  return a.step == b.step && SameBits(a.params, b.params) &&
         SameBits(a.m, b.m) && SameBits(a.v, b.v);
}

}  // namespace dp

#endif  // DP_TESTS_SAME_STATE_H_
