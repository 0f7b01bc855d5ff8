// NumPy .npy files (format versions 1.0, 2.0 and 3.0): the header parsed and
// checked, the data mapped from the file rather than read, so that an array
// larger than memory costs only the pages a batch touches.
#ifndef DP_COMMON_NPY_H_
#define DP_COMMON_NPY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dp {

// What the header says. Only little-endian (or one-byte) C-order arrays of
// plain numbers are accepted: kind 'f' (float), 'i' (signed), 'u' (unsigned).
struct NpyHeader {
  std::string descr;  // as written, e.g. "<f4", "|u1"
  char kind = 0;      // 'f' | 'i' | 'u'
  int item_size = 0;  // bytes per element
  std::vector<int64_t> shape;
  int64_t num_elements = 1;  // the product of shape
  size_t data_offset = 0;    // where the data starts in the file
};

// Parses the header at the start of a file's bytes (`head` may be the whole
// file or its first bytes; the header must lie within it). Errors name
// `path`: DATA_LOSS for a file that is not .npy or is cut short within its
// header, INVALID_ARGUMENT for a valid header this reader refuses (Fortran
// order, big-endian, object, structured or other non-numeric dtypes).
absl::StatusOr<NpyHeader> ParseNpyHeader(absl::string_view head,
                                         const std::string& path);

// A file's bytes, mapped read-only where the file can be mapped, else read.
class FileBytes {
 public:
  ~FileBytes();
  FileBytes(const FileBytes&) = delete;
  FileBytes& operator=(const FileBytes&) = delete;
  // NOT_FOUND for a missing file, UNAVAILABLE for other I/O errors.
  static absl::StatusOr<std::shared_ptr<const FileBytes>> Open(
      const std::string& path);
  const unsigned char* data() const { return data_; }
  size_t size() const { return size_; }
  bool mapped() const { return mapped_; }

 private:
  FileBytes() = default;
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
  std::string read_;  // the contents when the file could not be mapped
};

// An array of a .npy file: its header and a view of its data in the file's
// bytes, which `file` keeps alive.
struct NpyArray {
  std::string path;
  NpyHeader header;
  std::shared_ptr<const FileBytes> file;
  // header.num_elements * header.item_size bytes, little-endian.
  const unsigned char* data() const {
    return file->data() + header.data_offset;
  }
};

// Opens and checks `path`: the header as ParseNpyHeader, then that the file
// holds exactly the bytes the header describes (DATA_LOSS naming both
// counts otherwise).
absl::StatusOr<NpyArray> OpenNpy(const std::string& path);

}  // namespace dp

#endif  // DP_COMMON_NPY_H_
