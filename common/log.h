// Timestamped log lines on stderr, one write per line so processes sharing a
// terminal do not interleave mid-line.
#ifndef DP_COMMON_LOG_H_
#define DP_COMMON_LOG_H_

#include <string>

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace dp {

// Sets the tag printed on every line, e.g. "dp-ps" or "worker 1".
void SetLogTag(absl::string_view tag);
void LogLine(absl::string_view message);
// Drops every line from now on (fuzzers, which apply thousands of requests a
// second).
void SilenceLog();

template <typename... Args>
void Log(const absl::FormatSpec<Args...>& format, const Args&... args) {
  LogLine(absl::StrFormat(format, args...));
}

}  // namespace dp

#endif  // DP_COMMON_LOG_H_
