// Tests for common/npy.h and LoadNpy (common/dataset.h): .npy files written
// byte by byte, every refusal with the file and the problem it names, the
// mapped view of float32 data, and the conversions of the other dtypes.
#include "common/npy.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/dataset.h"
#include "gtest/gtest.h"
#include "tests/npy_files.h"
#include "tests/subprocess.h"

namespace dp {
namespace {

// Expects `s` to fail with `code` and a message naming `path` and holding
// `what`.
void ExpectRefused(const absl::Status& s, absl::StatusCode code,
                   const std::string& path, const std::string& what) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), path)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), what)) << s;
}

// A data directory with train_x.npy (float32 (n, 2, 3): 6 features, value
// 10 i + k) and train_y.npy (int64 labels i mod 3).
struct Files {
  TempDir dir;
  std::string x = dir.File("train_x.npy");
  std::string y = dir.File("train_y.npy");
  explicit Files(int n = 4) {
    std::vector<float> xs;
    std::vector<int64_t> ys;
    for (int i = 0; i < n; ++i) {
      for (int k = 0; k < 6; ++k) xs.push_back(10.0f * i + k);
      ys.push_back(i % 3);
    }
    WriteBytes(x, NpyBytes("<f4", {n, 2, 3}, RawBytes(xs)));
    WriteBytes(y, NpyBytes("<i8", {n}, RawBytes(ys)));
  }
};

TEST(NpyHeaderTest, EveryFormatVersionGivesTheSameHeader) {
  for (int major : {1, 2, 3}) {
    const std::string bytes =
        NpyBytes("<f8", {5, 7}, std::string(5 * 7 * 8, '\0'), major);
    absl::StatusOr<NpyHeader> h = ParseNpyHeader(bytes, "a.npy");
    ASSERT_TRUE(h.ok()) << "version " << major << ": " << h.status();
    EXPECT_EQ(h->kind, 'f');
    EXPECT_EQ(h->item_size, 8);
    EXPECT_EQ(h->shape, (std::vector<int64_t>{5, 7}));
    EXPECT_EQ(h->num_elements, 35);
    EXPECT_EQ(h->data_offset % 64, 0u) << "numpy pads the header to 64";
    EXPECT_EQ(h->data_offset, bytes.size() - 5 * 7 * 8);
  }
}

TEST(NpyHeaderTest, RefusesWhatItCannotReadByName) {
  struct Case {
    std::string bytes, what;
    absl::StatusCode code;
  };
  const std::string d(24, '\0');
  const std::vector<Case> cases = {
      {NpyBytes("<f4", {2, 3}, d, 1, /*fortran=*/true), "Fortran",
       absl::StatusCode::kInvalidArgument},
      {NpyBytes(">f4", {2, 3}, d), "big-endian",
       absl::StatusCode::kInvalidArgument},
      {NpyBytes("|O", {2, 3}, d), "object array",
       absl::StatusCode::kInvalidArgument},
      {NpyBytes("<c8", {2, 3}, d), "not supported",
       absl::StatusCode::kInvalidArgument},
      {NpyBytes("<f4", {2, 3}, d, /*major=*/4), "format version 4.0",
       absl::StatusCode::kDataLoss},
      {std::string("PK\x03\x04 a zip file", 16), "\\x93NUMPY",
       absl::StatusCode::kDataLoss},
      {NpyBytes("<f4", {2, 3}, d).substr(0, 40), "truncated",
       absl::StatusCode::kDataLoss},
  };
  for (const Case& c : cases) {
    ExpectRefused(ParseNpyHeader(c.bytes, "x.npy").status(), c.code, "x.npy",
                  c.what);
  }
  // A structured dtype's descr is a list of fields.
  std::string structured = NpyBytes("<f4", {2}, std::string(8, '\0'));
  const size_t at = structured.find("'<f4'");
  structured.replace(at, 5, "[('a', '<f4')]");
  ExpectRefused(ParseNpyHeader(structured, "s.npy").status(),
                absl::StatusCode::kInvalidArgument, "s.npy", "structured");
}

TEST(NpyTest, TruncatedAndOverlongFilesAreRefusedWithBothCounts) {
  TempDir dir;
  const std::string path = dir.File("a.npy");
  const std::string whole = NpyBytes("<f4", {4, 2}, std::string(32, '\0'));
  WriteBytes(path, whole.substr(0, whole.size() - 5));
  ExpectRefused(OpenNpy(path).status(), absl::StatusCode::kDataLoss, path,
                "is truncated: its header describes 32 data bytes");
  WriteBytes(path, whole + "xyz");
  ExpectRefused(OpenNpy(path).status(), absl::StatusCode::kDataLoss, path,
                "has trailing bytes");
  ExpectRefused(OpenNpy(dir.File("none.npy")).status(),
                absl::StatusCode::kNotFound, dir.File("none.npy"), "");
}

TEST(NpyTest, Float32FeaturesAreReadInPlaceFromTheMappedFile) {
  Files f;
  absl::StatusOr<Dataset> ds = LoadNpy(f.dir.path(), Split::kTrain);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->num_samples, 4);
  EXPECT_EQ(ds->dim, 6) << "(n, 2, 3) is flattened to 6 features";
  EXPECT_NE(ds->view, nullptr);
  EXPECT_TRUE(ds->x.empty()) << "float32 features are not copied";
  EXPECT_TRUE(ds->pixels.empty());
  EXPECT_EQ(ds->labels, (std::vector<int32_t>{0, 1, 2, 0}));
  // Used as they are: no normalisation.
  const std::vector<int32_t> rows = {3, 1};
  std::vector<float> x(2 * 6);
  std::vector<int32_t> y(2);
  GatherBatch(*ds, rows, x.data(), y.data());
  for (int k = 0; k < 6; ++k) {
    EXPECT_EQ(x[k], 30.0f + k);
    EXPECT_EQ(x[6 + k], 10.0f + k);
  }
  EXPECT_EQ(y, (std::vector<int32_t>{0, 1}));
}

TEST(NpyTest, Uint8AndFloat64AreConvertedAsTheyAreAndLabelsOfAnyIntegerType) {
  Files f(3);
  WriteBytes(f.x,
             NpyBytes("|u1", {3, 2},
                      RawBytes(std::vector<uint8_t>{0, 255, 7, 8, 9, 10})));
  WriteBytes(f.y,
             NpyBytes("|u1", {3}, RawBytes(std::vector<uint8_t>{2, 0, 1})));
  absl::StatusOr<Dataset> ds = LoadNpy(f.dir.path(), Split::kTrain);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->x, (std::vector<float>{0, 255, 7, 8, 9, 10})) << "not scaled";
  EXPECT_EQ(ds->labels, (std::vector<int32_t>{2, 0, 1}));

  WriteBytes(f.x, NpyBytes("<f8", {3, 1},
                           RawBytes(std::vector<double>{0.5, -1.25, 1e30})));
  WriteBytes(f.y,
             NpyBytes("<i2", {3}, RawBytes(std::vector<int16_t>{1, 300, 0})));
  ds = LoadNpy(f.dir.path(), Split::kTrain);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->x, (std::vector<float>{0.5f, -1.25f, 1e30f}));
  EXPECT_EQ(ds->labels, (std::vector<int32_t>{1, 300, 0}));
}

TEST(NpyTest, TheFingerprintFollowsTheBytesDtypeAndShape) {
  Files a, b;
  const DataFingerprint fa = LoadNpy(a.dir.path(), Split::kTrain)->fingerprint;
  EXPECT_EQ(fa, LoadNpy(b.dir.path(), Split::kTrain)->fingerprint)
      << "the same files in another directory";
  std::vector<int64_t> other = {0, 1, 2, 1};  // one label changed
  WriteBytes(b.y, NpyBytes("<i8", {4}, RawBytes(other)));
  EXPECT_FALSE(fa == LoadNpy(b.dir.path(), Split::kTrain)->fingerprint);
  // The same feature bytes as (4, 6) rather than (4, 2, 3).
  Files c;
  std::string bytes;
  {
    absl::StatusOr<NpyArray> x = OpenNpy(c.x);
    ASSERT_TRUE(x.ok()) << x.status();
    bytes.assign(reinterpret_cast<const char*>(x->data()), 4 * 6 * 4);
  }
  WriteBytes(c.x, NpyBytes("<f4", {4, 6}, bytes));
  EXPECT_FALSE(fa == LoadNpy(c.dir.path(), Split::kTrain)->fingerprint);
}

TEST(NpyTest, BadContentsAreRefusedNamingTheFileAndWhere) {
  Files f;
  const std::string dir = f.dir.path();
  // A negative label, by index.
  WriteBytes(f.y,
             NpyBytes("<i4", {4}, RawBytes(std::vector<int32_t>{0, 1, -2, 0})));
  ExpectRefused(LoadNpy(dir, Split::kTrain).status(),
                absl::StatusCode::kInvalidArgument, f.y,
                "label -2 of sample 2 is negative");
  // Float labels.
  WriteBytes(f.y, NpyBytes("<f4", {4}, std::string(16, '\0')));
  ExpectRefused(LoadNpy(dir, Split::kTrain).status(),
                absl::StatusCode::kInvalidArgument, f.y, "integer type");
  // More labels than samples.
  WriteBytes(f.y, NpyBytes("<i8", {5}, std::string(40, '\0')));
  ExpectRefused(LoadNpy(dir, Split::kTrain).status(),
                absl::StatusCode::kInvalidArgument, f.x, "holds 4 samples but");
  // Labels of shape (n, 1).
  WriteBytes(f.y, NpyBytes("<i8", {4, 1}, std::string(32, '\0')));
  ExpectRefused(LoadNpy(dir, Split::kTrain).status(),
                absl::StatusCode::kInvalidArgument, f.y, "shape (4, 1)");
  WriteBytes(f.y, NpyBytes("<i8", {4}, std::string(32, '\0')));
  // NaN and infinity, by sample and feature.
  std::vector<float> xs(4 * 6, 1.0f);
  xs[2 * 6 + 5] = std::numeric_limits<float>::quiet_NaN();
  WriteBytes(f.x, NpyBytes("<f4", {4, 6}, RawBytes(xs)));
  ExpectRefused(LoadNpy(dir, Split::kTrain).status(),
                absl::StatusCode::kInvalidArgument, f.x,
                "feature 5 of sample 2 is NaN");
  std::vector<double> big(4 * 6, 1.0);
  big[7] = 1e300;  // finite in float64, infinite in float32
  WriteBytes(f.x, NpyBytes("<f8", {4, 6}, RawBytes(big)));
  ExpectRefused(LoadNpy(dir, Split::kTrain).status(),
                absl::StatusCode::kInvalidArgument, f.x,
                "feature 1 of sample 1 is infinite");
  // Integer features other than uint8.
  WriteBytes(f.x, NpyBytes("<i4", {4, 6}, std::string(96, '\0')));
  ExpectRefused(LoadNpy(dir, Split::kTrain).status(),
                absl::StatusCode::kInvalidArgument, f.x,
                "float32, float64 or uint8");
  // No samples.
  WriteBytes(f.x, NpyBytes("<f4", {0, 6}, ""));
  WriteBytes(f.y, NpyBytes("<i8", {0}, ""));
  ExpectRefused(LoadNpy(dir, Split::kTrain).status(),
                absl::StatusCode::kInvalidArgument, f.x,
                "holds no samples (shape (0, 6))");
  WriteBytes(f.y, NpyBytes("<i8", {4}, std::string(32, '\0')));
  // One-dimensional features.
  WriteBytes(f.x, NpyBytes("<f4", {4}, std::string(16, '\0')));
  ExpectRefused(LoadNpy(dir, Split::kTrain).status(),
                absl::StatusCode::kInvalidArgument, f.x, "shape (4,)");
  // A missing file.
  ExpectRefused(LoadNpy(f.dir.File("nothing"), Split::kTrain).status(),
                absl::StatusCode::kNotFound, f.dir.File("nothing"),
                "does not exist");
}

TEST(NpyTest, AnAbsentTestSetHasNoSamplesButHalfOfOneIsAnError) {
  Files f;
  absl::StatusOr<Dataset> test = LoadNpy(f.dir.path(), Split::kTest);
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(test->num_samples, 0);
  WriteBytes(f.dir.File("test_x.npy"),
             NpyBytes("<f4", {1, 6}, std::string(24, '\0')));
  ExpectRefused(LoadNpy(f.dir.path(), Split::kTest).status(),
                absl::StatusCode::kNotFound, f.dir.File("test_y.npy"), "");
}

TEST(NpyTest, CheckFitsModelNamesTheFeatureCountAndTheFirstLabelTooLarge) {
  Files f;
  absl::StatusOr<Dataset> ds = LoadNpy(f.dir.path(), Split::kTrain);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_TRUE(CheckFitsModel(*ds, 6, 3).ok());
  ExpectRefused(CheckFitsModel(*ds, 5, 3), absl::StatusCode::kInvalidArgument,
                f.x,
                "6 features per sample, but the model's first layer "
                "takes 5");
  ExpectRefused(CheckFitsModel(*ds, 6, 2), absl::StatusCode::kInvalidArgument,
                f.y, "label 2 of sample 2 is outside [0, 2)");
}

TEST(NpyTest, LoadDatasetNamesNpyAndNeedsADirectory) {
  Files f;
  absl::StatusOr<Dataset> ds =
      LoadDataset("npy", f.dir.path(), 0, Split::kTrain);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->fingerprint, LoadNpy(f.dir.path(), Split::kTrain)->fingerprint);
  const absl::Status s = LoadDataset("npy", "", 0, Split::kTrain).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "--data_dir")) << s;
  EXPECT_TRUE(absl::StrContains(
      LoadDataset("csv", "", 0, Split::kTrain).status().message(), "npy"));
}

}  // namespace
}  // namespace dp
