// .npy header parser and the mapped view of a file's data.
#include "common/npy.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace dp {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicBytes = 6;

absl::Status Malformed(const std::string& path, absl::string_view why) {
  return absl::DataLossError(
      absl::StrFormat("%s is not a valid .npy file: %s", path, why));
}

// The header is a Python dict literal, e.g.
//   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
// This reads exactly the values numpy writes there: strings, booleans and
// tuples of integers; a list (a structured dtype's fields) is told apart so
// that it can be refused by name.
class DictReader {
 public:
  explicit DictReader(absl::string_view text) : text_(text) {}

  bool Consume(char c) {
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool Peek(char c) {
    SkipSpace();
    return pos_ < text_.size() && text_[pos_] == c;
  }
  bool String(std::string* out) {
    SkipSpace();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) {
      return false;
    }
    const char quote = text_[pos_];
    const size_t end = text_.find(quote, pos_ + 1);
    if (end == absl::string_view::npos) return false;
    *out = std::string(text_.substr(pos_ + 1, end - pos_ - 1));
    pos_ = end + 1;
    return true;
  }
  bool Word(absl::string_view word) {
    SkipSpace();
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }
  bool Int(int64_t* out) {
    SkipSpace();
    size_t end = pos_;
    while (end < text_.size() && absl::ascii_isdigit(text_[end])) ++end;
    // A trailing 'L' is what Python 2's numpy wrote for large dimensions.
    if (!absl::SimpleAtoi(text_.substr(pos_, end - pos_), out)) return false;
    pos_ = end;
    if (pos_ < text_.size() && text_[pos_] == 'L') ++pos_;
    return true;
  }
  // Skips a value this reader does not interpret (a nested list, say).
  bool SkipBalanced() {
    SkipSpace();
    int depth = 0;
    for (; pos_ < text_.size(); ++pos_) {
      const char c = text_[pos_];
      if (c == '[' || c == '(' || c == '{') ++depth;
      if (c == ']' || c == ')' || c == '}') --depth;
      if (depth == 0) {
        ++pos_;
        return true;
      }
    }
    return false;
  }

 private:
  void SkipSpace() {
    while (pos_ < text_.size() && absl::ascii_isspace(text_[pos_])) ++pos_;
  }
  absl::string_view text_;
  size_t pos_ = 0;
};

// descr -> kind and item size; INVALID_ARGUMENT for what is refused.
absl::Status ParseDescr(const std::string& descr, const std::string& path,
                        NpyHeader* h) {
  absl::string_view d(descr);
  char order = '|';
  if (!d.empty() &&
      (d[0] == '<' || d[0] == '>' || d[0] == '|' || d[0] == '=')) {
    order = d[0];
    d.remove_prefix(1);
  }
  const char kind = d.empty() ? 0 : d[0];
  int size = 0;
  if (kind == 'O') {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s holds an object array (dtype '%s'): only arrays of plain numbers "
        "can be read; save it with a numeric dtype",
        path, descr));
  }
  if (d.size() < 2 || !absl::SimpleAtoi(d.substr(1), &size) ||
      (kind != 'f' && kind != 'i' && kind != 'u') ||
      (kind == 'f' && size != 4 && size != 8) ||
      (kind != 'f' && size != 1 && size != 2 && size != 4 && size != 8)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s has dtype '%s', which is not supported (float32, float64, or an "
        "integer type of 1, 2, 4 or 8 bytes)",
        path, descr));
  }
  // '=' is the writer's native order; numpy itself writes '<' or '>'.
  if (size > 1 && order == '>') {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s is big-endian (dtype '%s'): save it little-endian, e.g. with "
        "a.astype(a.dtype.newbyteorder('<'))",
        path, descr));
  }
  h->kind = kind;
  h->item_size = size;
  return absl::OkStatus();
}

uint32_t LittleEndian(const unsigned char* p, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// The header's 'fortran_order': only False (C order) can be read.
absl::Status ParseOrder(DictReader& r, const std::string& path) {
  bool fortran = false;
  if (r.Word("True")) {
    fortran = true;
  } else if (!r.Word("False")) {
    return Malformed(path, "'fortran_order' is neither True nor False");
  }
  if (!fortran) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s is in Fortran (column-major) order: save it in C order, e.g. "
      "np.save(path, np.ascontiguousarray(a))",
      path));
}

// The header's 'shape' tuple into h->shape and h->num_elements.
absl::Status ParseShape(DictReader& r, const std::string& path, NpyHeader* h) {
  if (!r.Consume('(')) return Malformed(path, "'shape' is no tuple");
  while (!r.Consume(')')) {
    int64_t dim = 0;
    if (!r.Int(&dim)) return Malformed(path, "'shape' holds a non-integer");
    if (dim != 0 && h->num_elements > INT64_MAX / 8 / dim) {
      return Malformed(path, "'shape' is implausibly large");
    }
    h->shape.push_back(dim);
    h->num_elements *= dim;
    if (!r.Consume(',') && !r.Peek(')')) {
      return Malformed(path, "'shape' cannot be parsed");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<NpyHeader> ParseNpyHeader(absl::string_view head,
                                         const std::string& path) {
  const auto* p = reinterpret_cast<const unsigned char*>(head.data());
  if (head.size() < kMagicBytes + 2 ||
      head.substr(0, kMagicBytes) != absl::string_view(kMagic, kMagicBytes)) {
    return Malformed(path, head.size() < kMagicBytes + 2
                               ? "it is shorter than the .npy magic string"
                               : "it does not start with \\x93NUMPY");
  }
  const int major = p[6], minor = p[7];
  if (major < 1 || major > 3) {
    return Malformed(path, absl::StrFormat("format version %d.%d is not one "
                                           "of 1.0, 2.0 and 3.0",
                                           major, minor));
  }
  const int len_bytes = major == 1 ? 2 : 4;
  const size_t start = kMagicBytes + 2 + len_bytes;
  if (head.size() < start) {
    return Malformed(path, "it is truncated within its header length");
  }
  const size_t header_len = LittleEndian(p + kMagicBytes + 2, len_bytes);
  if (head.size() - start < header_len) {
    return Malformed(
        path, absl::StrFormat("it is truncated: the header is %d bytes, the "
                              "file has %d after the header length",
                              header_len, head.size() - start));
  }
  DictReader r(head.substr(start, header_len));
  NpyHeader h;
  h.data_offset = start + header_len;
  bool has_descr = false, has_order = false, has_shape = false;
  if (!r.Consume('{')) return Malformed(path, "the header is not a dict");
  while (!r.Consume('}')) {
    std::string key;
    if (!r.String(&key) || !r.Consume(':')) {
      return Malformed(path, "the header dict cannot be parsed");
    }
    if (key == "descr") {
      if (r.Peek('[')) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s holds a structured array (a dtype with fields): only arrays "
            "of plain numbers can be read",
            path));
      }
      if (!r.String(&h.descr)) return Malformed(path, "'descr' is no string");
      RETURN_IF_ERROR(ParseDescr(h.descr, path, &h));
      has_descr = true;
    } else if (key == "fortran_order") {
      RETURN_IF_ERROR(ParseOrder(r, path));
      has_order = true;
    } else if (key == "shape") {
      RETURN_IF_ERROR(ParseShape(r, path, &h));
      has_shape = true;
    } else if (!r.String(&key) && !r.SkipBalanced()) {
      return Malformed(path, "the header dict cannot be parsed");
    }
    if (!r.Consume(',') && !r.Peek('}')) {
      return Malformed(path, "the header dict cannot be parsed");
    }
  }
  if (!has_descr || !has_order || !has_shape) {
    return Malformed(path, absl::StrFormat("the header lacks %s",
                                           !has_descr   ? "'descr'"
                                           : !has_order ? "'fortran_order'"
                                                        : "'shape'"));
  }
  return h;
}

FileBytes::~FileBytes() {
  if (mapped_) ::munmap(const_cast<unsigned char*>(data_), size_);
}

absl::StatusOr<std::shared_ptr<const FileBytes>> FileBytes::Open(
    const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string msg =
        absl::StrFormat("cannot open %s: %s", path, std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(msg);
    if (err == EACCES) return absl::PermissionDeniedError(msg);
    return absl::UnavailableError(msg);
  }
  std::shared_ptr<FileBytes> bytes(new FileBytes());
  struct stat st;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
    void* m = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ,
                     MAP_PRIVATE, fd, 0);
    if (m != MAP_FAILED) {
      bytes->data_ = static_cast<const unsigned char*>(m);
      bytes->size_ = static_cast<size_t>(st.st_size);
      bytes->mapped_ = true;
      ::close(fd);
      return std::shared_ptr<const FileBytes>(std::move(bytes));
    }
  }
  // Not mappable (a pipe, an empty file, a file system without mmap): read.
  char buf[1 << 16];
  for (;;) {
    const ssize_t got = ::read(fd, buf, sizeof(buf));
    if (got == 0) break;
    if (got < 0) {
      if (errno == EINTR) continue;
      const std::string msg =
          absl::StrFormat("reading %s failed: %s", path, std::strerror(errno));
      ::close(fd);
      return absl::UnavailableError(msg);
    }
    bytes->read_.append(buf, static_cast<size_t>(got));
  }
  ::close(fd);
  bytes->data_ = reinterpret_cast<const unsigned char*>(bytes->read_.data());
  bytes->size_ = bytes->read_.size();
  return std::shared_ptr<const FileBytes>(std::move(bytes));
}

absl::StatusOr<NpyArray> OpenNpy(const std::string& path) {
  NpyArray a;
  a.path = path;
  ASSIGN_OR_RETURN(a.file, FileBytes::Open(path));
  ASSIGN_OR_RETURN(
      a.header,
      ParseNpyHeader(
          absl::string_view(reinterpret_cast<const char*>(a.file->data()),
                            a.file->size()),
          path));
  const uint64_t want =
      static_cast<uint64_t>(a.header.num_elements) * a.header.item_size;
  const uint64_t have = a.file->size() - a.header.data_offset;
  if (have != want) {
    return absl::DataLossError(absl::StrFormat(
        "%s %s: its header describes %d data bytes (shape (%s), dtype '%s'), "
        "the file holds %d",
        path, have < want ? "is truncated" : "has trailing bytes", want,
        absl::StrJoin(a.header.shape, ", "), a.header.descr, have));
  }
  return a;
}

}  // namespace dp
