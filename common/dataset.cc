// IDX readers (Fashion-MNIST, MNIST; gzipped or plain), the .npy data set
// and the synthetic seed workload.
#include "common/dataset.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/npy.h"
#include "common/random.h"
#include "common/status_macros.h"

namespace dp {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned byte, 3 dims
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned byte, 1 dim
constexpr size_t kImagesHeaderBytes = 16;      // magic, count, rows, cols
constexpr size_t kLabelsHeaderBytes = 8;       // magic, count

// Rng stream ids for the synthetic data, apart from the parameter-init
// streams (tensor offsets) and the epoch-order streams (0x0de0...).
constexpr uint64_t kSyntheticStream = 0x5e70'0000'0000'0000ULL;
constexpr uint64_t kTrainFeatures = kSyntheticStream + 0;
constexpr uint64_t kTrainLabels = kSyntheticStream + 1;
constexpr uint64_t kTestFeatures = kSyntheticStream + 2;
constexpr uint64_t kTestLabels = kSyntheticStream + 3;

// FNV-1a 64-bit, fed incrementally.
constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ULL;
constexpr uint64_t kFnvPrime = 0x100000001b3ULL;

uint64_t Fnv1a(uint64_t h, const unsigned char* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= kFnvPrime;
  }
  return h;
}

uint32_t BigEndian32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) |
         (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

bool Exists(const std::string& path, bool* is_dir) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return false;
  if (is_dir != nullptr) *is_dir = S_ISDIR(st.st_mode);
  return true;
}

// `<dir>/<base>.gz` when present, else `<dir>/<base>`; NOT_FOUND naming both.
absl::StatusOr<std::string> FindIdxFile(const std::string& dir,
                                        const std::string& base) {
  const std::string plain = absl::StrCat(dir, "/", base);
  const std::string gz = absl::StrCat(plain, ".gz");
  if (Exists(gz, nullptr)) return gz;
  if (Exists(plain, nullptr)) return plain;
  return absl::NotFoundError(
      absl::StrFormat("data file %s not found (nor %s)", gz, plain));
}

// A file's bytes. The buffer of an image file becomes the data set's pixels
// (the header cut off in place), so the pixels are never held twice.
using RawBytes = std::vector<uint8_t>;

// The decompressed size of `path` when cheaply known (st_size, or the gzip
// trailer's ISIZE clamped to deflate's maximum ratio), else 0. Only a hint
// for the buffer: the reader still grows the buffer as needed.
size_t SizeHint(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  size_t hint = 0;
  struct stat st;
  if (::fstat(fd, &st) == 0 && st.st_size > 0) {
    const size_t file_size = static_cast<size_t>(st.st_size);
    hint = file_size;
    unsigned char magic[2], isize[4];
    if (file_size >= 18 && ::pread(fd, magic, 2, 0) == 2 && magic[0] == 0x1f &&
        magic[1] == 0x8b && ::pread(fd, isize, 4, st.st_size - 4) == 4) {
      const size_t n = size_t{isize[0]} | size_t{isize[1]} << 8 |
                       size_t{isize[2]} << 16 | size_t{isize[3]} << 24;
      hint = std::min(n, file_size * 1032);
    }
  }
  ::close(fd);
  return hint;
}

// The decompressed contents of `path`; gzread passes plain files through
// unchanged, so one reader serves both. A gzip stream that ends early is not
// an error here: `*stream_truncated` is set and the caller's length check
// reports the bytes expected against those read.
absl::StatusOr<RawBytes> ReadMaybeGzipped(const std::string& path,
                                          bool* stream_truncated) {
  *stream_truncated = false;
  errno = 0;
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    const int err = errno;
    const std::string msg =
        absl::StrFormat("cannot open %s: %s", path,
                        err != 0 ? std::strerror(err) : "out of memory");
    if (err == ENOENT) return absl::NotFoundError(msg);
    if (err == EACCES) return absl::PermissionDeniedError(msg);
    return absl::UnavailableError(msg);
  }
  gzbuffer(f, 1 << 20);
  // One spare byte so that the read which sees end of file needs no growth.
  RawBytes out(std::max(SizeHint(path), size_t{1} << 16) + 1);
  size_t size = 0;
  for (;;) {
    if (size == out.size()) out.resize(2 * out.size());
    const size_t want = std::min(out.size() - size, size_t{1} << 30);
    const int got = gzread(f, out.data() + size, static_cast<unsigned>(want));
    if (got < 0) {
      int errnum = 0;
      const std::string what = gzerror(f, &errnum);
      const std::string msg = absl::StrFormat(
          "reading %s failed after %d bytes: %s", path, size,
          errnum == Z_ERRNO ? std::string(std::strerror(errno)) : what);
      gzclose(f);
      if (errnum == Z_ERRNO) return absl::UnavailableError(msg);
      return absl::DataLossError(msg);  // Z_DATA_ERROR: corrupt gzip data
    }
    if (got == 0) break;
    size += static_cast<size_t>(got);
  }
  out.resize(size);  // never reallocates when shrinking
  // gzread reports a gzip stream that ends early (Z_BUF_ERROR) only here.
  const int close_rc = gzclose(f);
  if (close_rc == Z_BUF_ERROR) {
    *stream_truncated = true;
  } else if (close_rc != Z_OK) {
    return absl::DataLossError(
        absl::StrFormat("reading %s failed: zlib error %d", path, close_rc));
  }
  return out;
}

// Reads an IDX file of unsigned bytes with magic `magic` (0x0800 | number of
// dimensions) and checks that its length is exactly the header plus the
// product of its dimensions. Returns the whole file, header included.
absl::StatusOr<RawBytes> ReadIdxFile(const std::string& path, uint32_t magic) {
  bool stream_truncated = false;
  ASSIGN_OR_RETURN(RawBytes data, ReadMaybeGzipped(path, &stream_truncated));
  const char* const gz_note =
      stream_truncated ? " (the gzip stream ends early)" : "";
  const int num_dims = static_cast<int>(magic & 0xff);
  const size_t header_bytes = 4 + 4 * size_t(num_dims);
  if (data.size() < header_bytes) {
    return absl::DataLossError(absl::StrFormat(
        "%s is truncated: expected at least a %d-byte IDX header, read %d "
        "bytes%s",
        path, header_bytes, data.size(), gz_note));
  }
  const unsigned char* p = data.data();
  const uint32_t got_magic = BigEndian32(p);
  if (got_magic != magic) {
    return absl::DataLossError(absl::StrFormat(
        "%s has magic number 0x%08x, expected 0x%08x (IDX, unsigned bytes, "
        "%d dimensions)",
        path, got_magic, magic, num_dims));
  }
  // At most 3 dimensions of < 2^32 each: the product fits only if checked.
  uint64_t payload = 1;
  for (int d = 0; d < num_dims; ++d) {
    const uint64_t dim = BigEndian32(p + 4 + 4 * d);
    if (dim != 0 && payload > UINT64_MAX / 4 / dim) {
      return absl::DataLossError(
          absl::StrFormat("%s: header dimensions are implausibly large", path));
    }
    payload *= dim;
  }
  const uint64_t expected = header_bytes + payload;
  if (data.size() < expected) {
    return absl::DataLossError(absl::StrFormat(
        "%s is truncated: its header describes %d bytes, read only %d%s", path,
        expected, data.size(), gz_note));
  }
  if (data.size() > expected) {
    return absl::DataLossError(absl::StrFormat(
        "%s has %d trailing bytes after the %d bytes its header describes",
        path, data.size() - expected, expected));
  }
  if (stream_truncated) {  // length right, yet the gzip trailer is missing
    return absl::DataLossError(
        absl::StrFormat("%s is truncated: the gzip stream ends early", path));
  }
  return data;
}

const char* SplitPrefix(Split split) {
  return split == Split::kTrain ? "train" : "t10k";
}

}  // namespace

absl::StatusOr<Dataset> LoadIdx(const std::string& dir, Split split) {
  bool is_dir = false;
  if (!Exists(dir, &is_dir)) {
    return absl::NotFoundError(
        absl::StrFormat("data directory %s does not exist", dir));
  }
  if (!is_dir) {
    return absl::NotFoundError(
        absl::StrFormat("data directory %s is not a directory", dir));
  }
  const std::string prefix = SplitPrefix(split);
  ASSIGN_OR_RETURN(const std::string images_path,
                   FindIdxFile(dir, prefix + "-images-idx3-ubyte"));
  ASSIGN_OR_RETURN(const std::string labels_path,
                   FindIdxFile(dir, prefix + "-labels-idx1-ubyte"));

  ASSIGN_OR_RETURN(RawBytes images, ReadIdxFile(images_path, kImagesMagic));
  const unsigned char* ih = images.data();
  const uint32_t n = BigEndian32(ih + 4);
  const uint32_t rows = BigEndian32(ih + 8);
  const uint32_t cols = BigEndian32(ih + 12);
  // A well-formed IDX file of another shape is the wrong data, not damage.
  if (uint64_t{rows} * cols != kImageDim) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s holds %dx%d images; expected %d pixels per image",
                        images_path, rows, cols, kImageDim));
  }
  ASSIGN_OR_RETURN(const RawBytes labels,
                   ReadIdxFile(labels_path, kLabelsMagic));
  const unsigned char* lh = labels.data();
  const uint32_t num_labels = BigEndian32(lh + 4);
  if (num_labels != n) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s holds %d images but %s holds %d labels",
                        images_path, n, labels_path, num_labels));
  }

  const unsigned char* raw_labels = lh + kLabelsHeaderBytes;
  Dataset ds;
  ds.num_samples = n;
  ds.dim = kImageDim;
  ds.labels.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    if (raw_labels[i] >= kNumClasses) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: label %d of sample %d is outside [0, %d)",
                          labels_path, raw_labels[i], i, kNumClasses));
    }
    ds.labels[i] = raw_labels[i];
  }
  // The pixels are the file after its header, in the file's buffer.
  ds.pixels = std::move(images);
  ds.pixels.erase(ds.pixels.begin(), ds.pixels.begin() + kImagesHeaderBytes);
  ds.features_source = images_path;
  ds.labels_source = labels_path;

  // Fingerprint: FNV-1a 64 over the raw pixel bytes (all images, row-major,
  // headers excluded) followed by the raw label bytes, so a gzipped and a
  // plain copy of the same data agree.
  uint64_t h = Fnv1a(kFnvOffset, ds.pixels.data(), ds.pixels.size());
  h = Fnv1a(h, raw_labels, n);
  ds.fingerprint = DataFingerprint{ds.num_samples, h};
  return ds;
}

namespace {

// A .npy array's element i as the value it holds, for the integer dtypes
// ParseNpyHeader accepts (little-endian).
int64_t IntAt(const NpyArray& a, int64_t i) {
  const unsigned char* p = a.data() + i * a.header.item_size;
  const int size = a.header.item_size;
  uint64_t u = 0;
  for (int b = size - 1; b >= 0; --b) u = (u << 8) | p[b];
  if (a.header.kind == 'i' && size < 8 && (u >> (8 * size - 1)) != 0) {
    u |= ~uint64_t{0} << (8 * size);  // sign-extend
  }
  // An unsigned 64-bit value beyond INT64_MAX reads as negative: it is out
  // of every label range all the same, and is reported as what it is below.
  int64_t v;
  std::memcpy(&v, &u, sizeof(v));
  return v;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("(", absl::StrJoin(shape, ", "),
                      shape.size() == 1 ? ",)" : ")");
}

// Mixes a .npy array into a fingerprint: its dtype and shape, then its data
// bytes as the file holds them, so that a copy of the same file agrees and
// the same bytes read as another dtype or shape do not.
uint64_t HashNpy(uint64_t h, const NpyArray& a) {
  const std::string meta =
      absl::StrCat(a.header.descr, ShapeString(a.header.shape));
  h = Fnv1a(h, reinterpret_cast<const unsigned char*>(meta.data()),
            meta.size());
  return Fnv1a(h, a.data(),
               static_cast<size_t>(a.header.num_elements) * a.header.item_size);
}

// INVALID_ARGUMENT naming the first feature that is NaN or infinite.
absl::Status CheckFinite(const float* x, int64_t n, int64_t dim,
                         const std::string& path, const char* what) {
  for (int64_t i = 0; i < n * dim; ++i) {
    if (!std::isfinite(x[i])) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: feature %d of sample %d is %s%s", path, i % dim, i / dim,
          std::isnan(x[i]) ? "NaN" : "infinite", what));
    }
  }
  return absl::OkStatus();
}

// The features of `a` (kind and size checked) into `ds`.
absl::Status TakeFeatures(const NpyArray& a, Dataset* ds) {
  const NpyHeader& h = a.header;
  const int64_t n = ds->num_samples, dim = ds->dim;
  if (h.kind == 'f' && h.item_size == 4 &&
      h.data_offset % alignof(float) == 0) {
    // In place: the mapping is the data set's storage.
    ds->view = reinterpret_cast<const float*>(a.data());
    ds->storage = a.file;
    return CheckFinite(ds->view, n, dim, a.path, "");
  }
  ds->x.resize(static_cast<size_t>(n * dim));
  if (h.kind == 'f' && h.item_size == 8) {
    for (int64_t i = 0; i < n * dim; ++i) {
      double v;
      std::memcpy(&v, a.data() + 8 * i, sizeof(v));
      ds->x[i] = static_cast<float>(v);
    }
    // A finite float64 beyond float32's range becomes infinite here.
    return CheckFinite(ds->x.data(), n, dim, a.path,
                       " (as float32: float64 values beyond +-3.4e38 are "
                       "infinite there)");
  }
  if (h.kind == 'f' && h.item_size == 4) {  // unaligned: copied
    std::memcpy(ds->x.data(), a.data(), ds->x.size() * sizeof(float));
    return CheckFinite(ds->x.data(), n, dim, a.path, "");
  }
  if (h.kind == 'u' && h.item_size == 1) {
    for (int64_t i = 0; i < n * dim; ++i) ds->x[i] = a.data()[i];
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s has dtype '%s': features must be float32, float64 or uint8", a.path,
      h.descr));
}

}  // namespace

absl::StatusOr<Dataset> LoadNpy(const std::string& dir, Split split) {
  bool is_dir = false;
  if (!Exists(dir, &is_dir) || !is_dir) {
    return absl::NotFoundError(absl::StrFormat(
        "data directory %s %s", dir,
        Exists(dir, nullptr) ? "is not a directory" : "does not exist"));
  }
  const char* prefix = split == Split::kTrain ? "train" : "test";
  const std::string x_path = absl::StrCat(dir, "/", prefix, "_x.npy");
  const std::string y_path = absl::StrCat(dir, "/", prefix, "_y.npy");
  if (split == Split::kTest && !Exists(x_path, nullptr) &&
      !Exists(y_path, nullptr)) {
    Dataset none;
    none.dim = 0;
    none.features_source = x_path;
    none.labels_source = y_path;
    return none;
  }
  ASSIGN_OR_RETURN(const NpyArray x, OpenNpy(x_path));
  ASSIGN_OR_RETURN(const NpyArray y, OpenNpy(y_path));
  const std::vector<int64_t>& xs = x.header.shape;
  const std::vector<int64_t>& ys = y.header.shape;
  if (xs.size() < 2) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s has shape %s: features must be (samples, features...), e.g. "
        "reshape(-1, 1) for one feature",
        x_path, ShapeString(xs)));
  }
  if (ys.size() != 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s has shape %s: labels must be one integer per sample, shape (N,)",
        y_path, ShapeString(ys)));
  }
  if (y.header.kind == 'f') {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s has dtype '%s': labels must be of an integer type",
                        y_path, y.header.descr));
  }
  if (xs[0] != ys[0]) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s holds %d samples but %s holds %d labels", x_path,
                        xs[0], y_path, ys[0]));
  }
  const int64_t n = xs[0];
  if (n == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s holds no samples (shape %s)", x_path,
                        ShapeString(xs)));
  }
  const int64_t dim = x.header.num_elements / n;
  if (dim > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s has %d features per sample; at most 2^30 are supported", x_path,
        dim));
  }
  Dataset ds;
  ds.num_samples = n;
  ds.dim = static_cast<int>(dim);
  ds.features_source = x_path;
  ds.labels_source = y_path;
  RETURN_IF_ERROR(TakeFeatures(x, &ds));
  ds.labels.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t label = IntAt(y, i);
    if (label < 0 || label > INT32_MAX) {
      const bool huge = y.header.kind == 'u' && y.header.item_size == 8;
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: label %s of sample %d is %s", y_path,
                          huge ? absl::StrCat(static_cast<uint64_t>(label))
                               : absl::StrCat(label),
                          i, label < 0 && !huge ? "negative" : "too large"));
    }
    ds.labels[i] = static_cast<int32_t>(label);
  }
  ds.fingerprint = DataFingerprint{n, HashNpy(HashNpy(kFnvOffset, x), y)};
  return ds;
}

absl::Status CheckFitsModel(const Dataset& data, int input_dim,
                            int num_classes) {
  if (data.num_samples == 0) return absl::OkStatus();
  if (data.dim != input_dim) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s has %d features per sample, but the model's first layer takes %d "
        "(dp-ps --layers)",
        data.features_source, data.dim, input_dim));
  }
  for (size_t i = 0; i < data.labels.size(); ++i) {
    if (data.labels[i] >= num_classes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: label %d of sample %d is outside [0, %d), the model's outputs "
          "(dp-ps --layers)",
          data.labels_source, data.labels[i], i, num_classes));
    }
  }
  return absl::OkStatus();
}

Dataset MakeSynthetic(uint64_t seed, Split split) {
  const bool train = split == Split::kTrain;
  Rng features(seed, train ? kTrainFeatures : kTestFeatures);
  Rng labels(seed, train ? kTrainLabels : kTestLabels);
  Dataset ds;
  ds.num_samples = kSyntheticSamples;
  ds.dim = kImageDim;
  ds.x.resize(static_cast<size_t>(kSyntheticSamples) * kImageDim);
  for (float& v : ds.x) v = static_cast<float>(features.Normal());
  ds.labels.resize(kSyntheticSamples);
  for (int32_t& l : ds.labels) l = static_cast<int32_t>(labels.Below(10));

  // Fingerprint: FNV-1a 64 over each float's IEEE-754 bits as 4 bytes,
  // least significant first, then each label as one byte (as in IDX), so
  // the value does not depend on the host's byte order.
  uint64_t h = kFnvOffset;
  for (float v : ds.x) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    const unsigned char b[4] = {static_cast<unsigned char>(bits),
                                static_cast<unsigned char>(bits >> 8),
                                static_cast<unsigned char>(bits >> 16),
                                static_cast<unsigned char>(bits >> 24)};
    h = Fnv1a(h, b, 4);
  }
  for (int32_t l : ds.labels) {
    const unsigned char b = static_cast<unsigned char>(l);
    h = Fnv1a(h, &b, 1);
  }
  ds.fingerprint = DataFingerprint{ds.num_samples, h};
  return ds;
}

absl::StatusOr<Dataset> LoadDataset(absl::string_view name,
                                    const std::string& dir, uint64_t seed,
                                    Split split) {
  if (name == "synthetic") return MakeSynthetic(seed, split);
  if (name == "npy") {
    if (dir.empty()) {
      return absl::InvalidArgumentError(
          "data set npy needs a data directory (--data_dir) holding "
          "train_x.npy and train_y.npy");
    }
    return LoadNpy(dir, split);
  }
  if (name == "fashion-mnist") {
    return LoadIdx(dir.empty() ? std::string(kDefaultFashionMnistDir) : dir,
                   split);
  }
  if (name == "mnist") {
    if (dir.empty()) {
      return absl::InvalidArgumentError(
          "data set mnist needs a data directory (--data_dir); it has no "
          "default");
    }
    return LoadIdx(dir, split);
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("unknown data set \"%s\"; valid names: fashion-mnist, "
                      "mnist, npy, synthetic",
                      name));
}

float NormalisedPixel(uint8_t p) {
  return (static_cast<float>(p) / 255.0f - kPixelMean) / kPixelStd;
}

void GatherBatch(const Dataset& data, absl::Span<const int32_t> rows, float* x,
                 int32_t* y) {
  const int64_t dim = data.dim;
  if (data.pixels.empty()) {
    const float* features = data.features();
    for (size_t i = 0; i < rows.size(); ++i) {
      std::memcpy(x + i * dim, features + rows[i] * dim, dim * sizeof(float));
      y[i] = data.labels[rows[i]];
    }
    return;
  }
  // One table lookup per pixel; the table is computed once.
  static const std::array<float, 256> kTable = [] {
    std::array<float, 256> t;
    for (int p = 0; p < 256; ++p) t[p] = NormalisedPixel(p);
    return t;
  }();
  for (size_t i = 0; i < rows.size(); ++i) {
    const uint8_t* in = data.pixels.data() + rows[i] * dim;
    float* out = x + i * dim;
    for (int64_t k = 0; k < dim; ++k) out[k] = kTable[in[k]];
    y[i] = data.labels[rows[i]];
  }
}

}  // namespace dp
