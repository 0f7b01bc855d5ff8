// The CPU time this process has used (user and system, all threads): what
// the end lines divide by the steps, so that a benchmark can say where each
// core's time went.
#ifndef DP_COMMON_CPU_TIME_H_
#define DP_COMMON_CPU_TIME_H_

#include "absl/time/time.h"

namespace dp {

absl::Duration ProcessCpuTime();

}  // namespace dp

#endif  // DP_COMMON_CPU_TIME_H_
