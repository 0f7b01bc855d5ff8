// Timestamped log lines on stderr.
#include "common/log.h"

#include <unistd.h>

#include <atomic>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace dp {
namespace {
absl::Mutex tag_mu;
std::atomic<bool> silent{false};
std::string& Tag() {
  static auto* tag = new std::string("dp");
  return *tag;
}
}  // namespace

void SetLogTag(absl::string_view tag) {
  absl::MutexLock lock(&tag_mu);
  Tag() = std::string(tag);
}

void SilenceLog() { silent.store(true); }

void LogLine(absl::string_view message) {
  if (silent.load(std::memory_order_relaxed)) return;
  std::string tag;
  {
    absl::MutexLock lock(&tag_mu);
    tag = Tag();
  }
  std::string line = absl::StrFormat(
      "%s [%s] %s\n",
      absl::FormatTime("%H:%M:%E3S", absl::Now(), absl::LocalTimeZone()), tag,
      message);
  // A single write keeps lines whole when several processes share stderr.
  ssize_t unused = ::write(STDERR_FILENO, line.data(), line.size());
  (void)unused;
}

}  // namespace dp
