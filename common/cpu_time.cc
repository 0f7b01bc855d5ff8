#include "common/cpu_time.h"

#include <sys/resource.h>

namespace dp {
namespace {

absl::Duration Of(const timeval& t) {
  return absl::Seconds(t.tv_sec) + absl::Microseconds(t.tv_usec);
}

}  // namespace

absl::Duration ProcessCpuTime() {
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return absl::ZeroDuration();
  return Of(usage.ru_utime) + Of(usage.ru_stime);
}

}  // namespace dp
