// glibc malloc thresholds for large, short-lived message buffers.
#include "common/malloc_tuning.h"

#include <malloc.h>

namespace dp {

void KeepLargeBuffersInHeap() {
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
}

}  // namespace dp
