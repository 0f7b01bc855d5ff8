// Tests for common/dataset.h: IDX files crafted with known pixels (plain and
// gzipped), every malformed-file error, the real Fashion-MNIST when
// installed, the synthetic seed workload, and gathering batches from both.
#include "common/dataset.h"

#include <stdlib.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace dp {
namespace {

using Bytes = std::vector<unsigned char>;

void PutBigEndian32(Bytes& b, uint32_t v) {
  b.push_back(static_cast<unsigned char>(v >> 24));
  b.push_back(static_cast<unsigned char>(v >> 16));
  b.push_back(static_cast<unsigned char>(v >> 8));
  b.push_back(static_cast<unsigned char>(v));
}

Bytes ImagesIdx(uint32_t n, uint32_t rows, uint32_t cols, const Bytes& pixels,
                uint32_t magic = 0x00000803) {
  Bytes b;
  PutBigEndian32(b, magic);
  PutBigEndian32(b, n);
  PutBigEndian32(b, rows);
  PutBigEndian32(b, cols);
  b.insert(b.end(), pixels.begin(), pixels.end());
  return b;
}

Bytes LabelsIdx(const Bytes& labels, uint32_t magic = 0x00000801) {
  Bytes b;
  PutBigEndian32(b, magic);
  PutBigEndian32(b, static_cast<uint32_t>(labels.size()));
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}

// Image i's pixel k is (7k + 31i) mod 256: every byte value occurs,
// including 0 and 255.
Bytes KnownPixels(int n) {
  Bytes p;
  for (int i = 0; i < n; ++i) {
    for (int k = 0; k < kImageDim; ++k) {
      p.push_back(static_cast<unsigned char>((7 * k + 31 * i) % 256));
    }
  }
  return p;
}

// The reference: how images were normalised when data sets held float32,
// one pixel at a time.
float Normalised(unsigned char pixel) {
  return (static_cast<float>(pixel) / 255.0f - kPixelMean) / kPixelStd;
}

// All rows of `ds`, gathered.
std::vector<float> GatherAll(const Dataset& ds) {
  std::vector<int32_t> rows(ds.num_samples);
  std::iota(rows.begin(), rows.end(), 0);
  std::vector<float> x(rows.size() * ds.dim);
  std::vector<int32_t> y(rows.size());
  GatherBatch(ds, rows, x.data(), y.data());
  return x;
}

// Counts the values of `got` whose bits differ from Normalised(pixels[i]),
// reporting the first few.
int CountBitMismatches(const std::vector<float>& got, const uint8_t* pixels,
                       size_t n) {
  int mismatches = 0;
  for (size_t i = 0; i < n; ++i) {
    const float want = Normalised(pixels[i]);
    if (std::memcmp(&got[i], &want, sizeof(float)) != 0 && ++mismatches <= 5) {
      ADD_FAILURE() << "x[" << i << "] = " << got[i] << ", pixel "
                    << int{pixels[i]} << " should give " << want;
    }
  }
  return mismatches;
}

// FNV-1a 64 as the contract states it: over raw pixels, then raw labels.
uint64_t Fnv1a(const Bytes& pixels, const Bytes& labels) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const Bytes* b : {&pixels, &labels}) {
    for (unsigned char c : *b) {
      h ^= c;
      h *= 0x100000001b3ULL;
    }
  }
  return h;
}

class IdxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "dataset_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr) << "mkdtemp " << tmpl;
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(const std::string& name) const {
    return absl::StrCat(dir_, "/", name);
  }

  void WritePlain(const std::string& name, const Bytes& b) {
    std::ofstream out(Path(name), std::ios::binary);
    out.write(reinterpret_cast<const char*>(b.data()),
              static_cast<std::streamsize>(b.size()));
    ASSERT_TRUE(out.good()) << "writing " << Path(name);
  }

  void WriteGz(const std::string& name, const Bytes& b) {
    gzFile f = gzopen(Path(name).c_str(), "wb");
    ASSERT_NE(f, nullptr) << "gzopen " << Path(name);
    ASSERT_EQ(gzwrite(f, b.data(), static_cast<unsigned>(b.size())),
              static_cast<int>(b.size()));
    ASSERT_EQ(gzclose(f), Z_OK);
  }

  // A valid train split of `n` images with labels i % 10, plain files.
  void WriteValidTrain(int n) {
    pixels_ = KnownPixels(n);
    labels_.clear();
    for (int i = 0; i < n; ++i)
      labels_.push_back(static_cast<unsigned char>(i % 10));
    WritePlain("train-images-idx3-ubyte", ImagesIdx(n, 28, 28, pixels_));
    WritePlain("train-labels-idx1-ubyte", LabelsIdx(labels_));
  }

  std::string dir_;
  Bytes pixels_;
  Bytes labels_;
};

void ExpectMatches(const Dataset& ds, const Bytes& pixels,
                   const Bytes& labels) {
  const int64_t n = static_cast<int64_t>(labels.size());
  ASSERT_EQ(ds.num_samples, n);
  EXPECT_EQ(ds.dim, kImageDim);
  EXPECT_EQ(ds.pixels, pixels);
  EXPECT_TRUE(ds.x.empty()) << "images are kept as bytes only";
  ASSERT_EQ(ds.labels.size(), labels.size());
  const std::vector<float> x = GatherAll(ds);
  EXPECT_EQ(CountBitMismatches(x, pixels.data(), pixels.size()), 0);
  for (size_t i = 0; i < labels.size(); ++i) {
    EXPECT_EQ(ds.labels[i], labels[i]) << "label " << i;
  }
  EXPECT_EQ(ds.fingerprint.num_samples, n);
  EXPECT_EQ(ds.fingerprint.hash, Fnv1a(pixels, labels));
}

TEST(NormalisationTest, ExtremePixelsMapToKnownValues) {
  EXPECT_NEAR(Normalised(0), -0.2860 / 0.3530, 1e-6);
  EXPECT_NEAR(Normalised(255), (1.0 - 0.2860) / 0.3530, 1e-6);
}

TEST_F(IdxTest, PlainFilesLoadWithExactNormalisedPixelsAndLabels) {
  WriteValidTrain(3);
  absl::StatusOr<Dataset> ds = LoadIdx(dir_, Split::kTrain);
  ASSERT_TRUE(ds.ok()) << ds.status();
  ExpectMatches(*ds, pixels_, labels_);
  EXPECT_NEAR(GatherAll(*ds)[0], -0.2860 / 0.3530, 1e-6);  // pixel 0 is 0
}

// The value the float32 loader computed for this file, before images were
// kept as bytes: checkpoints and running jobs compare it.
TEST_F(IdxTest, FingerprintKeepsTheValueOfTheFloatLoader) {
  WriteValidTrain(3);
  absl::StatusOr<Dataset> ds = LoadIdx(dir_, Split::kTrain);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->fingerprint.hash, 0x88866e0324b6b418ULL);
  EXPECT_EQ(ds->fingerprint.num_samples, 3);
}

TEST_F(IdxTest, GatheredBatchIsBitIdenticalToFloat32NormalisationInRowOrder) {
  WriteValidTrain(12);  // every byte value occurs
  absl::StatusOr<Dataset> ds = LoadIdx(dir_, Split::kTrain);
  ASSERT_TRUE(ds.ok()) << ds.status();
  const std::vector<int32_t> rows = {11, 0, 5, 5, 3};  // any order, repeats
  std::vector<float> x(rows.size() * kImageDim, -1.0f);
  std::vector<int32_t> y(rows.size(), -1);
  GatherBatch(*ds, rows, x.data(), y.data());
  Bytes want_pixels;
  for (size_t i = 0; i < rows.size(); ++i) {
    want_pixels.insert(want_pixels.end(), pixels_.begin() + rows[i] * kImageDim,
                       pixels_.begin() + (rows[i] + 1) * kImageDim);
    EXPECT_EQ(y[i], labels_[rows[i]]) << "row " << i;
  }
  EXPECT_EQ(CountBitMismatches(x, want_pixels.data(), want_pixels.size()), 0);
}

TEST(NormalisationTest, EveryByteMapsToItsFloat32Normalisation) {
  for (int p = 0; p < 256; ++p) {
    const float want = Normalised(static_cast<unsigned char>(p));
    const float got = NormalisedPixel(static_cast<uint8_t>(p));
    EXPECT_EQ(std::memcmp(&got, &want, sizeof(float)), 0) << "pixel " << p;
  }
}

TEST_F(IdxTest, GzippedFilesLoadExactlyLikePlainOnes) {
  const Bytes pixels = KnownPixels(4);
  const Bytes labels = {9, 0, 3, 7};
  WriteGz("train-images-idx3-ubyte.gz", ImagesIdx(4, 28, 28, pixels));
  WriteGz("train-labels-idx1-ubyte.gz", LabelsIdx(labels));
  absl::StatusOr<Dataset> ds = LoadIdx(dir_, Split::kTrain);
  ASSERT_TRUE(ds.ok()) << ds.status();
  ExpectMatches(*ds, pixels, labels);
}

TEST_F(IdxTest, FingerprintIsTheSameForGzippedAndPlainCopies) {
  WriteValidTrain(2);
  absl::StatusOr<Dataset> plain = LoadIdx(dir_, Split::kTrain);
  ASSERT_TRUE(plain.ok()) << plain.status();
  WriteGz("t10k-images-idx3-ubyte.gz", ImagesIdx(2, 28, 28, pixels_));
  WriteGz("t10k-labels-idx1-ubyte.gz", LabelsIdx(labels_));
  absl::StatusOr<Dataset> gz = LoadIdx(dir_, Split::kTest);
  ASSERT_TRUE(gz.ok()) << gz.status();
  EXPECT_EQ(plain->fingerprint, gz->fingerprint);
}

TEST_F(IdxTest, FingerprintChangesWhenOneLabelChanges) {
  WriteValidTrain(2);
  absl::StatusOr<Dataset> a = LoadIdx(dir_, Split::kTrain);
  ASSERT_TRUE(a.ok()) << a.status();
  labels_[1] = 5;
  WritePlain("train-labels-idx1-ubyte", LabelsIdx(labels_));
  absl::StatusOr<Dataset> b = LoadIdx(dir_, Split::kTrain);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->fingerprint.num_samples, b->fingerprint.num_samples);
  EXPECT_NE(a->fingerprint.hash, b->fingerprint.hash);
}

TEST_F(IdxTest, GzippedFileIsPreferredOverPlainWhenBothExist) {
  WriteValidTrain(2);  // plain labels 0, 1
  const Bytes gz_labels = {4, 8};
  WriteGz("train-labels-idx1-ubyte.gz", LabelsIdx(gz_labels));
  absl::StatusOr<Dataset> ds = LoadIdx(dir_, Split::kTrain);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->labels, (std::vector<int32_t>{4, 8}));
}

TEST_F(IdxTest, TestSplitReadsTheT10kFiles) {
  WriteValidTrain(3);
  const Bytes pixels = KnownPixels(1);
  const Bytes labels = {6};
  WritePlain("t10k-images-idx3-ubyte", ImagesIdx(1, 28, 28, pixels));
  WritePlain("t10k-labels-idx1-ubyte", LabelsIdx(labels));
  absl::StatusOr<Dataset> ds = LoadIdx(dir_, Split::kTest);
  ASSERT_TRUE(ds.ok()) << ds.status();
  ExpectMatches(*ds, pixels, labels);
}

TEST_F(IdxTest, TruncatedImageFileIsDataLossNamingTheFileAndByteCounts) {
  WriteValidTrain(2);
  Bytes images = ImagesIdx(2, 28, 28, pixels_);
  images.resize(images.size() - 100);  // 16 + 1568 = 1584 expected, 1484 read
  WritePlain("train-images-idx3-ubyte", images);
  absl::StatusOr<Dataset> ds = LoadIdx(dir_, Split::kTrain);
  ASSERT_EQ(ds.status().code(), absl::StatusCode::kDataLoss) << ds.status();
  const std::string msg(ds.status().message());
  EXPECT_NE(msg.find(Path("train-images-idx3-ubyte")), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("1584"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1484"), std::string::npos) << msg;
}

TEST_F(IdxTest, TruncatedGzipStreamIsDataLossNamingTheFile) {
  WriteValidTrain(2);
  WriteGz("train-labels-idx1-ubyte.gz", LabelsIdx(labels_));
  const std::string gz = Path("train-labels-idx1-ubyte.gz");
  // Cut the compressed stream in half: zlib sees an unexpected end of file.
  std::filesystem::resize_file(gz, std::filesystem::file_size(gz) / 2);
  absl::StatusOr<Dataset> ds = LoadIdx(dir_, Split::kTrain);
  ASSERT_EQ(ds.status().code(), absl::StatusCode::kDataLoss) << ds.status();
  EXPECT_NE(ds.status().message().find(gz), absl::string_view::npos)
      << ds.status();
}

TEST_F(IdxTest, TruncatedHeaderIsDataLossNamingTheFile) {
  WriteValidTrain(1);
  WritePlain("train-labels-idx1-ubyte", Bytes{0, 0, 8});
  absl::StatusOr<Dataset> ds = LoadIdx(dir_, Split::kTrain);
  ASSERT_EQ(ds.status().code(), absl::StatusCode::kDataLoss) << ds.status();
  EXPECT_NE(ds.status().message().find(Path("train-labels-idx1-ubyte")),
            absl::string_view::npos)
      << ds.status();
}

TEST_F(IdxTest, GarbageMagicIsDataLossNamingTheFile) {
  WriteValidTrain(1);
  WritePlain("train-images-idx3-ubyte",
             ImagesIdx(1, 28, 28, pixels_, /*magic=*/0xdeadbeef));
  absl::StatusOr<Dataset> ds = LoadIdx(dir_, Split::kTrain);
  ASSERT_EQ(ds.status().code(), absl::StatusCode::kDataLoss) << ds.status();
  const std::string msg(ds.status().message());
  EXPECT_NE(msg.find(Path("train-images-idx3-ubyte")), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("0xdeadbeef"), std::string::npos) << msg;
}

TEST_F(IdxTest, LabelFileWithImageMagicIsDataLoss) {
  WriteValidTrain(1);
  WritePlain("train-labels-idx1-ubyte", LabelsIdx(labels_, 0x00000803));
  absl::StatusOr<Dataset> ds = LoadIdx(dir_, Split::kTrain);
  ASSERT_EQ(ds.status().code(), absl::StatusCode::kDataLoss) << ds.status();
  EXPECT_NE(ds.status().message().find(Path("train-labels-idx1-ubyte")),
            absl::string_view::npos)
      << ds.status();
}

TEST_F(IdxTest, TrailingBytesAreDataLossNamingTheFile) {
  WriteValidTrain(2);
  Bytes labels = LabelsIdx(labels_);
  labels.push_back(0);
  labels.push_back(0);
  labels.push_back(0);
  WritePlain("train-labels-idx1-ubyte", labels);
  absl::StatusOr<Dataset> ds = LoadIdx(dir_, Split::kTrain);
  ASSERT_EQ(ds.status().code(), absl::StatusCode::kDataLoss) << ds.status();
  const std::string msg(ds.status().message());
  EXPECT_NE(msg.find(Path("train-labels-idx1-ubyte")), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("3 trailing bytes"), std::string::npos) << msg;
}

TEST_F(IdxTest, ImageAndLabelCountMismatchIsInvalidArgumentNamingBothFiles) {
  WriteValidTrain(3);
  WritePlain("train-labels-idx1-ubyte", LabelsIdx(Bytes{1, 2}));
  absl::StatusOr<Dataset> ds = LoadIdx(dir_, Split::kTrain);
  ASSERT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument)
      << ds.status();
  const std::string msg(ds.status().message());
  EXPECT_NE(msg.find(Path("train-images-idx3-ubyte")), std::string::npos)
      << msg;
  EXPECT_NE(msg.find(Path("train-labels-idx1-ubyte")), std::string::npos)
      << msg;
}

TEST_F(IdxTest, LabelOutOfRangeIsInvalidArgumentNamingTheFile) {
  WriteValidTrain(3);
  WritePlain("train-labels-idx1-ubyte", LabelsIdx(Bytes{1, 10, 2}));
  absl::StatusOr<Dataset> ds = LoadIdx(dir_, Split::kTrain);
  ASSERT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument)
      << ds.status();
  const std::string msg(ds.status().message());
  EXPECT_NE(msg.find(Path("train-labels-idx1-ubyte")), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("10"), std::string::npos) << msg;
}

TEST_F(IdxTest, ImagesThatAreNot28x28AreInvalidArgument) {
  WriteValidTrain(1);
  WritePlain("train-images-idx3-ubyte",
             ImagesIdx(1, 28, 29, Bytes(28 * 29, 0)));
  absl::StatusOr<Dataset> ds = LoadIdx(dir_, Split::kTrain);
  ASSERT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument)
      << ds.status();
  EXPECT_NE(ds.status().message().find(Path("train-images-idx3-ubyte")),
            absl::string_view::npos)
      << ds.status();
}

TEST_F(IdxTest, MissingDirectoryIsNotFound) {
  const std::string missing = Path("no-such-dir");
  absl::StatusOr<Dataset> ds = LoadIdx(missing, Split::kTrain);
  ASSERT_EQ(ds.status().code(), absl::StatusCode::kNotFound) << ds.status();
  EXPECT_EQ(ds.status().message(),
            absl::StrCat("data directory ", missing, " does not exist"));
}

TEST_F(IdxTest, MissingLabelFileIsNotFoundNamingTheFile) {
  WriteValidTrain(1);
  std::filesystem::remove(Path("train-labels-idx1-ubyte"));
  absl::StatusOr<Dataset> ds = LoadIdx(dir_, Split::kTrain);
  ASSERT_EQ(ds.status().code(), absl::StatusCode::kNotFound) << ds.status();
  EXPECT_NE(ds.status().message().find(Path("train-labels-idx1-ubyte")),
            absl::string_view::npos)
      << ds.status();
}

TEST_F(IdxTest, MissingTestSplitIsNotFoundNamingTheT10kFile) {
  WriteValidTrain(1);
  absl::StatusOr<Dataset> ds = LoadIdx(dir_, Split::kTest);
  ASSERT_EQ(ds.status().code(), absl::StatusCode::kNotFound) << ds.status();
  EXPECT_NE(ds.status().message().find(Path("t10k-images-idx3-ubyte")),
            absl::string_view::npos)
      << ds.status();
}

TEST_F(IdxTest, LoadDatasetReadsMnistAndFashionMnistFromTheGivenDirectory) {
  WriteValidTrain(2);
  for (const char* name : {"mnist", "fashion-mnist"}) {
    absl::StatusOr<Dataset> ds = LoadDataset(name, dir_, 1, Split::kTrain);
    ASSERT_TRUE(ds.ok()) << name << ": " << ds.status();
    ExpectMatches(*ds, pixels_, labels_);
  }
}

TEST(LoadDatasetTest, UnknownNameIsInvalidArgumentListingTheValidNames) {
  absl::StatusOr<Dataset> ds = LoadDataset("cifar", "", 1, Split::kTrain);
  ASSERT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument)
      << ds.status();
  const std::string msg(ds.status().message());
  for (const char* name : {"cifar", "fashion-mnist", "mnist", "synthetic"}) {
    EXPECT_NE(msg.find(name), std::string::npos) << name << " in: " << msg;
  }
}

TEST(LoadDatasetTest, SyntheticIsMakeSyntheticAndIgnoresTheDirectory) {
  absl::StatusOr<Dataset> ds =
      LoadDataset("synthetic", "/no/such/dir", 42, Split::kTest);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->fingerprint, MakeSynthetic(42, Split::kTest).fingerprint);
  EXPECT_EQ(ds->x, MakeSynthetic(42, Split::kTest).x);
}

// The real data set, when Debian's dataset-fashion-mnist package is installed.
TEST(FashionMnistTest, RealFilesLoadWithStableFingerprints) {
  if (!std::filesystem::is_directory(kDefaultFashionMnistDir)) {
    GTEST_SKIP() << kDefaultFashionMnistDir
                 << " is absent (install dataset-fashion-mnist)";
  }
  for (const auto& [split, count] :
       {std::pair{Split::kTrain, 60000}, std::pair{Split::kTest, 10000}}) {
    absl::StatusOr<Dataset> a = LoadDataset("fashion-mnist", "", 0, split);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->num_samples, count);
    EXPECT_EQ(a->pixels.size(), static_cast<size_t>(count) * kImageDim);
    std::vector<int> per_class(kNumClasses, 0);
    for (int32_t l : a->labels) {
      ASSERT_GE(l, 0);
      ASSERT_LT(l, kNumClasses);
      ++per_class[l];
    }
    for (int c = 0; c < kNumClasses; ++c) {
      EXPECT_EQ(per_class[c], count / kNumClasses) << "class " << c;
    }
    // The pixels are the files' bytes: the fingerprint hashes them and has
    // the value the float32 loader computed.
    EXPECT_EQ(a->fingerprint.hash, split == Split::kTrain
                                       ? 0x47041d1f3a1991feULL
                                       : 0x7625417625bda6cfULL);
    EXPECT_EQ(
        CountBitMismatches(GatherAll(*a), a->pixels.data(), a->pixels.size()),
        0);
    absl::StatusOr<Dataset> b = LoadIdx(kDefaultFashionMnistDir, split);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(a->fingerprint, b->fingerprint);
    EXPECT_EQ(a->fingerprint.num_samples, count);
  }
}

TEST(SyntheticTest, IsDeterministicPerSeed) {
  const Dataset a = MakeSynthetic(7, Split::kTrain);
  const Dataset b = MakeSynthetic(7, Split::kTrain);
  EXPECT_EQ(a.x, b.x);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_EQ(a.fingerprint, b.fingerprint);
}

TEST(SyntheticTest, DifferentSeedsGiveDifferentData) {
  const Dataset a = MakeSynthetic(7, Split::kTrain);
  const Dataset b = MakeSynthetic(8, Split::kTrain);
  EXPECT_NE(a.x, b.x);
  EXPECT_NE(a.labels, b.labels);
  EXPECT_NE(a.fingerprint.hash, b.fingerprint.hash);
}

TEST(SyntheticTest, TrainAndTestSplitsDiffer) {
  const Dataset train = MakeSynthetic(7, Split::kTrain);
  const Dataset test = MakeSynthetic(7, Split::kTest);
  EXPECT_NE(train.x, test.x);
  EXPECT_NE(train.labels, test.labels);
  EXPECT_NE(train.fingerprint.hash, test.fingerprint.hash);
}

TEST(SyntheticTest, FingerprintKeepsItsValue) {
  EXPECT_EQ(MakeSynthetic(11, Split::kTrain).fingerprint.hash,
            0x2fc5f9706c623e70ULL);
}

TEST(SyntheticTest, GatheredBatchCopiesTheFloatRows) {
  const Dataset ds = MakeSynthetic(3, Split::kTrain);
  EXPECT_TRUE(ds.pixels.empty());
  const std::vector<int32_t> rows = {999, 0, 7, 7};
  std::vector<float> x(rows.size() * kImageDim);
  std::vector<int32_t> y(rows.size());
  GatherBatch(ds, rows, x.data(), y.data());
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_TRUE(std::equal(x.begin() + i * kImageDim,
                           x.begin() + (i + 1) * kImageDim,
                           ds.x.begin() + rows[i] * kImageDim))
        << "row " << i;
    EXPECT_EQ(y[i], ds.labels[rows[i]]) << "row " << i;
  }
}

TEST(SyntheticTest, HasTheDocumentedShape) {
  const Dataset ds = MakeSynthetic(3, Split::kTrain);
  EXPECT_EQ(ds.num_samples, kSyntheticSamples);
  EXPECT_EQ(ds.dim, kImageDim);
  EXPECT_EQ(ds.x.size(), static_cast<size_t>(kSyntheticSamples) * kImageDim);
  EXPECT_EQ(ds.labels.size(), static_cast<size_t>(kSyntheticSamples));
  EXPECT_EQ(ds.fingerprint.num_samples, kSyntheticSamples);
}

TEST(SyntheticTest, FeaturesAreStandardNormal) {
  for (Split split : {Split::kTrain, Split::kTest}) {
    const Dataset ds = MakeSynthetic(11, split);
    double sum = 0, sum_sq = 0;
    for (float v : ds.x) {
      ASSERT_TRUE(std::isfinite(v));
      sum += v;
      sum_sq += double{v} * v;
    }
    const double n = static_cast<double>(ds.x.size());
    const double mean = sum / n;
    const double std = std::sqrt(sum_sq / n - mean * mean);
    // 784,000 draws: the standard error of the mean is ~0.0011.
    EXPECT_NEAR(mean, 0.0, 0.01);
    EXPECT_NEAR(std, 1.0, 0.01);
  }
}

TEST(SyntheticTest, LabelsAreRoughlyUniformOverAllTenClasses) {
  const Dataset ds = MakeSynthetic(5, Split::kTrain);
  std::vector<int> per_class(kNumClasses, 0);
  for (int32_t l : ds.labels) {
    ASSERT_GE(l, 0);
    ASSERT_LT(l, kNumClasses);
    ++per_class[l];
  }
  // Expected 100 each, standard deviation ~9.5.
  for (int c = 0; c < kNumClasses; ++c) {
    EXPECT_GT(per_class[c], 50) << "class " << c;
    EXPECT_LT(per_class[c], 150) << "class " << c;
  }
}

}  // namespace
}  // namespace dp
