// Data sets: IDX files (Fashion-MNIST, MNIST; .gz or plain), NumPy .npy
// files (the user's own features and labels, used as they are) and the
// synthetic seed workload, and the gathering of a batch from them. IDX images
// are kept as their pixel bytes and normalised as
// x = (pixel/255 - 0.2860) / 0.3530 when gathered.
#ifndef DP_COMMON_DATASET_H_
#define DP_COMMON_DATASET_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace dp {

inline constexpr int kImageDim = 784;
inline constexpr int kNumClasses = 10;
inline constexpr float kPixelMean = 0.2860f;
inline constexpr float kPixelStd = 0.3530f;
inline constexpr int64_t kSyntheticSamples = 1000;

enum class Split { kTrain, kTest };

// Identifies a data set's contents; every worker of a job must report the same.
struct DataFingerprint {
  int64_t num_samples = 0;
  uint64_t hash = 0;  // FNV-1a 64 over the raw samples and labels
  bool operator==(const DataFingerprint& o) const {
    return num_samples == o.num_samples && hash == o.hash;
  }
};

// Samples of `dim` features each, stored as compactly as their source
// allows: images keep their pixel bytes (a quarter of float32's memory) and
// are normalised when gathered; float32 features of a file are read where
// the file is mapped (`view`, kept alive by `storage`); other features are
// float32 in `x`. Exactly one of `pixels`, `x` and `view` holds the features
// (none when num_samples is 0).
struct Dataset {
  int64_t num_samples = 0;
  int dim = kImageDim;
  std::vector<uint8_t> pixels;  // (num_samples, dim) row-major, raw bytes
  std::vector<float> x;         // (num_samples, dim) row-major, the features
  const float* view = nullptr;  // (num_samples, dim) row-major, in `storage`
  std::shared_ptr<const void> storage;
  std::vector<int32_t> labels;  // (num_samples), each >= 0
  DataFingerprint fingerprint;
  // Where the features and the labels come from, for messages: file paths,
  // or the data set's name.
  std::string features_source = "synthetic";
  std::string labels_source = "synthetic";

  // The float32 features when they are not pixel bytes.
  const float* features() const { return view != nullptr ? view : x.data(); }
};

// The float32 input of pixel byte p: (p / 255 - kPixelMean) / kPixelStd,
// evaluated in float32 in that order.
float NormalisedPixel(uint8_t p);

// Writes the features of samples `rows` of `data` into x (rows.size(), dim),
// normalised, and their labels into y (rows.size()). Each row must be in
// [0, data.num_samples).
void GatherBatch(const Dataset& data, absl::Span<const int32_t> rows, float* x,
                 int32_t* y);

// Reads `<dir>/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]`.
// Errors name the file and the problem: NOT_FOUND for a missing directory or
// file, DATA_LOSS for a truncated or malformed file, INVALID_ARGUMENT for
// mismatched image/label counts or labels out of range.
absl::StatusOr<Dataset> LoadIdx(const std::string& dir, Split split);

// Reads `<dir>/train_x.npy` and `<dir>/train_y.npy` (kTrain) or
// `<dir>/test_x.npy` and `<dir>/test_y.npy` (kTest), as they are: features
// float32 (mapped, not copied), float64 or uint8 (converted to float32 as
// is, not scaled), shape (N, ...) flattened to (N, F); labels of any integer
// type, shape (N). The test files may both be absent: then the result has no
// samples. Errors name the file and the problem: NOT_FOUND for a missing
// directory or file, DATA_LOSS for a truncated or non-.npy file,
// INVALID_ARGUMENT for a dtype or layout refused (Fortran order, big-endian,
// objects), mismatched lengths, a negative label (its index) or a NaN or
// infinite feature (its sample and feature).
absl::StatusOr<Dataset> LoadNpy(const std::string& dir, Split split);

// INVALID_ARGUMENT naming the source and the problem unless `data` fits an
// MLP that takes `input_dim` features and has `num_classes` outputs: its
// samples have input_dim features and every label is below num_classes (the
// first that is not is named, with its index). A data set with no samples
// fits any model.
[[nodiscard]] absl::Status CheckFitsModel(const Dataset& data, int input_dim,
                                          int num_classes);

// `kSyntheticSamples` samples of N(0,1) features with uniform labels 0..9,
// drawn from `seed`; the test split uses an independent stream.
Dataset MakeSynthetic(uint64_t seed, Split split);

// "fashion-mnist" | "mnist" -> LoadIdx(dir); "npy" -> LoadNpy(dir);
// "synthetic" -> MakeSynthetic.
// INVALID_ARGUMENT for an unknown name.
absl::StatusOr<Dataset> LoadDataset(absl::string_view name,
                                    const std::string& dir, uint64_t seed,
                                    Split split);

// Where Debian's dataset-fashion-mnist package puts the files.
inline constexpr char kDefaultFashionMnistDir[] =
    "/usr/share/datasets/fashion-mnist";

}  // namespace dp

#endif  // DP_COMMON_DATASET_H_
