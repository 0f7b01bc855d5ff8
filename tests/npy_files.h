// .npy files written byte by byte for tests, as numpy's np.save writes them
// (the header padded with spaces to a multiple of 64 bytes, then '\n').
#ifndef DP_TESTS_NPY_FILES_H_
#define DP_TESTS_NPY_FILES_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace dp {

// The bytes of a .npy file of format version `major`.0 whose header holds
// `descr`, `fortran` and `shape`, followed by `data` as given.
std::string NpyBytes(absl::string_view descr, const std::vector<int64_t>& shape,
                     absl::string_view data, int major = 1,
                     bool fortran = false);

// `values` as the data bytes of a little-endian array (this host's order:
// the tests run on little-endian machines).
template <typename T>
std::string RawBytes(const std::vector<T>& values) {
  std::string s(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(&s[0], values.data(), s.size());
  return s;
}

// Writes `bytes` to `path`, failing the test when it cannot.
void WriteBytes(const std::string& path, absl::string_view bytes);

}  // namespace dp

#endif  // DP_TESTS_NPY_FILES_H_
