// .npy files written byte by byte for tests.
#include "tests/npy_files.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

namespace dp {

std::string NpyBytes(absl::string_view descr, const std::vector<int64_t>& shape,
                     absl::string_view data, int major, bool fortran) {
  std::string dict = absl::StrCat(
      "{'descr': '", descr, "', 'fortran_order': ", fortran ? "True" : "False",
      ", 'shape': (", absl::StrJoin(shape, ", "),
      shape.size() == 1 ? ",), " : "), ", "}");
  const size_t prefix = 6 + 2 + (major == 1 ? 2 : 4);
  // Spaces and a final '\n' up to a multiple of 64, as numpy pads.
  const size_t total = (prefix + dict.size() + 1 + 63) / 64 * 64;
  dict.append(total - prefix - dict.size() - 1, ' ');
  dict.push_back('\n');
  std::string out("\x93NUMPY", 6);
  out.push_back(static_cast<char>(major));
  out.push_back('\0');
  const size_t len = dict.size();
  for (int b = 0; b < (major == 1 ? 2 : 4); ++b) {
    out.push_back(static_cast<char>((len >> (8 * b)) & 0xff));
  }
  out += dict;
  out.append(data.data(), data.size());
  return out;
}

void WriteBytes(const std::string& path, absl::string_view bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();
  ASSERT_TRUE(f.good()) << "cannot write " << path;
}

}  // namespace dp
