// File helpers with absl::Status errors that name the path.
#ifndef DP_COMMON_FILE_UTIL_H_
#define DP_COMMON_FILE_UTIL_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dp {

// Whole file contents. NOT_FOUND if missing; other I/O errors name errno.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Writes `contents` so that `path` holds either its old contents or the new
// ones, never a mix: temporary file in the same directory, fsync, rename,
// fsync of the directory. On error `path` is untouched and the temporary
// file is removed. Safe to call concurrently for one path: each call has its
// own temporary file, and `path` ends up holding one caller's contents.
[[nodiscard]] absl::Status WriteFileAtomic(const std::string& path,
                                           absl::string_view contents);

}  // namespace dp

#endif  // DP_COMMON_FILE_UTIL_H_
