// Data sets: IDX files (Fashion-MNIST, MNIST; .gz or plain) and the synthetic
// seed workload, and the gathering of a batch from them. Images are kept as
// their pixel bytes and normalised as x = (pixel/255 - 0.2860) / 0.3530 when
// gathered.
#ifndef DP_COMMON_DATASET_H_
#define DP_COMMON_DATASET_H_

#include <cstdint>
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
  uint64_t hash = 0;   // FNV-1a 64 over the raw samples and labels
  bool operator==(const DataFingerprint& o) const {
    return num_samples == o.num_samples && hash == o.hash;
  }
};

// Samples of `dim` features each, stored as compactly as their source
// allows: images keep their pixel bytes (a quarter of float32's memory) and
// are normalised when gathered; features that are not bytes are float32.
// Exactly one of `pixels` and `x` is non-empty (both when num_samples is 0).
struct Dataset {
  int64_t num_samples = 0;
  int dim = kImageDim;
  std::vector<uint8_t> pixels;  // (num_samples, dim) row-major, raw bytes
  std::vector<float> x;         // (num_samples, dim) row-major, the features
  std::vector<int32_t> labels;  // (num_samples), each in [0, kNumClasses)
  DataFingerprint fingerprint;
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

// `kSyntheticSamples` samples of N(0,1) features with uniform labels 0..9,
// drawn from `seed`; the test split uses an independent stream.
Dataset MakeSynthetic(uint64_t seed, Split split);

// "fashion-mnist" | "mnist" -> LoadIdx(dir); "synthetic" -> MakeSynthetic.
// INVALID_ARGUMENT for an unknown name.
absl::StatusOr<Dataset> LoadDataset(absl::string_view name,
                                    const std::string& dir, uint64_t seed,
                                    Split split);

// Where Debian's dataset-fashion-mnist package puts the files.
inline constexpr char kDefaultFashionMnistDir[] =
    "/usr/share/datasets/fashion-mnist";

}  // namespace dp

#endif  // DP_COMMON_DATASET_H_
