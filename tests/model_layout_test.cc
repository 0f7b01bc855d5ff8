// SimpleNet layout and PyTorch-default initialisation.
#include "common/model_layout.h"

#include <cmath>
#include <cstring>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace dp {
namespace {

TEST(ModelLayoutTest, SimpleNetHasPyTorchStateDictLayout) {
  const ModelLayout l = ModelLayout::SimpleNet();
  EXPECT_EQ(l.num_params(), 235146);
  const std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {
      {"fc1.weight", {256, 784}}, {"fc1.bias", {256}},
      {"fc2.weight", {128, 256}}, {"fc2.bias", {128}},
      {"fc3.weight", {10, 128}},  {"fc3.bias", {10}}};
  ASSERT_EQ(l.tensors().size(), expected.size());
  int64_t offset = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(l.tensors()[i].name, expected[i].first);
    EXPECT_EQ(l.tensors()[i].shape, expected[i].second);
    EXPECT_EQ(l.tensors()[i].offset, offset) << l.tensors()[i].name;
    offset += l.tensors()[i].size;
  }
  EXPECT_EQ(offset, l.num_params());
}

TEST(ModelLayoutTest, FingerprintDiffersBetweenArchitectures) {
  EXPECT_EQ(ModelLayout::SimpleNet().Fingerprint(),
            ModelLayout::Mlp({784, 256, 128, 10}).Fingerprint());
  EXPECT_NE(ModelLayout::SimpleNet().Fingerprint(),
            ModelLayout::Mlp({784, 128, 256, 10}).Fingerprint());
}

// Workers of every version present it: it must not move.
TEST(ModelLayoutTest, SimpleNetsFingerprintIsPinned) {
  EXPECT_EQ(ModelLayout::SimpleNet().Fingerprint(), 0x97d43e5109664b8aULL);
}

std::vector<TensorInfo> Cnn() {
  return {{"conv1.weight", {4, 1, 3, 3}}, {"conv1.bias", {4}},
          {"fc.weight", {10, 100}},       {"fc.bias", {10}},
          {"scale", {}}};
}

TEST(ModelLayoutTest, FromTensorsLaysThemOutInTheOrderGiven) {
  absl::StatusOr<ModelLayout> l = ModelLayout::FromTensors(Cnn());
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_FALSE(l->is_mlp());
  const int64_t sizes[] = {36, 4, 1000, 10, 1};
  int64_t offset = 0;
  ASSERT_EQ(l->tensors().size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(l->tensors()[i].name, Cnn()[i].name);
    EXPECT_EQ(l->tensors()[i].offset, offset);
    EXPECT_EQ(l->tensors()[i].size, sizes[i]);
    offset += sizes[i];
  }
  EXPECT_EQ(l->num_params(), offset);
  EXPECT_NE(l->Describe().find("5 tensors (conv1.weight [4,1,3,3]"),
            std::string::npos)
      << l->Describe();
}

TEST(ModelLayoutTest, AnMlpsTensorsInItsOrderAreThatMlp) {
  std::vector<TensorInfo> tensors = ModelLayout::SimpleNet().tensors();
  for (TensorInfo& t : tensors) t.offset = t.size = 0;
  absl::StatusOr<ModelLayout> l = ModelLayout::FromTensors(tensors);
  ASSERT_TRUE(l.ok()) << l.status();
  ASSERT_TRUE(l->is_mlp());
  EXPECT_EQ(l->dims(), ModelLayout::SimpleNet().dims());
  EXPECT_EQ(l->Fingerprint(), ModelLayout::SimpleNet().Fingerprint());
}

TEST(ModelLayoutTest, AnotherOrderShapeOrNameIsAnotherFingerprint) {
  const uint64_t base = ModelLayout::FromTensors(Cnn())->Fingerprint();
  std::vector<TensorInfo> swapped = Cnn();
  std::swap(swapped[0], swapped[1]);
  std::vector<TensorInfo> reshaped = Cnn();
  reshaped[2].shape = {100, 10};
  std::vector<TensorInfo> renamed = Cnn();
  renamed[4].name = "scale2";
  for (const auto& other : {swapped, reshaped, renamed}) {
    absl::StatusOr<ModelLayout> l = ModelLayout::FromTensors(other);
    ASSERT_TRUE(l.ok()) << l.status();
    EXPECT_NE(l->Fingerprint(), base);
  }
  EXPECT_EQ(ModelLayout::FromTensors(Cnn())->Fingerprint(), base);
}

TEST(ModelLayoutTest, FromTensorsRefusesWhatNoModelIsNamingTheTensor) {
  struct Case {
    std::vector<TensorInfo> tensors;
    std::string says;
  };
  std::vector<TensorInfo> twice = Cnn();
  twice[3].name = "conv1.bias";
  std::vector<TensorInfo> zero = Cnn();
  zero[2].shape = {10, 0};
  std::vector<TensorInfo> unnamed = Cnn();
  unnamed[1].name = "";
  const Case cases[] = {
      {{}, "a model needs a tensor"},
      {twice, "tensor \"conv1.bias\" [10]: named twice"},
      {zero, "tensor \"fc.weight\" [10,0]: every dimension must be at least 1"},
      {unnamed, "a tensor needs a name"},
      {{{"huge", {int64_t{1} << 20, int64_t{1} << 20, 3}}},
       "tensor \"huge\" [1048576,1048576,3]: the model has more than"},
  };
  for (const Case& c : cases) {
    absl::Status s = ModelLayout::FromTensors(c.tensors).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.says;
    EXPECT_TRUE(absl::StrContains(s.message(), c.says)) << s;
  }
}

TEST(ModelLayoutDeathTest, MlpAccessorsStopTheProcessOnAnotherModel) {
  const ModelLayout l = *ModelLayout::FromTensors(Cnn());
  EXPECT_DEATH(l.dims(), "is_mlp");
  EXPECT_DEATH(l.weight(0), "is_mlp");
}

TEST(InitParamsTest, SameSeedGivesIdenticalBytesOtherSeedDiffers) {
  const ModelLayout l = ModelLayout::SimpleNet();
  const std::vector<float> a = InitParams(l, 7), b = InitParams(l, 7),
                           c = InitParams(l, 8);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  EXPECT_NE(0, std::memcmp(a.data(), c.data(), a.size() * sizeof(float)));
}

TEST(InitParamsTest, EveryTensorIsUniformWithinOneOverSqrtFanIn) {
  const ModelLayout l = ModelLayout::SimpleNet();
  const std::vector<float> p = InitParams(l, 42);
  for (int layer = 0; layer < l.num_layers(); ++layer) {
    const double bound = 1.0 / std::sqrt(double(l.dims()[layer]));
    for (const TensorInfo* t : {&l.weight(layer), &l.bias(layer)}) {
      double sum = 0, sum_sq = 0, lo = 1e9, hi = -1e9;
      for (int64_t i = 0; i < t->size; ++i) {
        const double x = p[t->offset + i];
        ASSERT_LE(std::fabs(x), bound) << t->name << "[" << i << "]";
        sum += x;
        sum_sq += x * x;
        lo = std::min(lo, x);
        hi = std::max(hi, x);
      }
      const double n = t->size, mean = sum / n, var = sum_sq / n - mean * mean;
      // U(-b, b): mean 0, variance b^2/3; loose 6-sigma-ish bounds.
      EXPECT_NEAR(mean, 0.0, 6 * bound / std::sqrt(3 * n)) << t->name;
      // The sample variance of U(-b, b) has a relative spread of sqrt(0.8/n).
      EXPECT_NEAR(var, bound * bound / 3,
                  5 * std::sqrt(0.8 / n) * bound * bound / 3)
          << t->name;
      if (t->size >= 100) {  // the extremes come close to the bound
        EXPECT_GT(hi, 0.9 * bound) << t->name;
        EXPECT_LT(lo, -0.9 * bound) << t->name;
      }
    }
  }
}

TEST(MlpDimsTest, ParsesWidthsInputsFirstAndPrintsThemBack) {
  absl::StatusOr<std::vector<int>> dims = ParseMlpDims("20,64,32,3", "--x");
  ASSERT_TRUE(dims.ok()) << dims.status();
  EXPECT_EQ(*dims, (std::vector<int>{20, 64, 32, 3}));
  EXPECT_EQ(MlpDimsString(*dims), "20,64,32,3");
  const ModelLayout l = ModelLayout::Mlp(*dims);
  EXPECT_EQ(l.num_params(), 20 * 64 + 64 + 64 * 32 + 32 + 32 * 3 + 3);
  EXPECT_EQ(l.tensors().back().name, "fc3.bias");
  EXPECT_NE(l.Fingerprint(), ModelLayout::SimpleNet().Fingerprint());
}

TEST(MlpDimsTest, RefusesTooFewWidthsAZeroWidthAndNonNumbersByName) {
  struct Case {
    const char* text;
    const char* what;
  };
  for (const Case& c :
       {Case{"784", "at least two widths"},
        Case{"784,0,10", "width 0 (entry 2 of 784,0,10)"},
        Case{"784,-3,10", "width -3"}, Case{"784,,10", "\"\" is not a width"},
        Case{"784,x,10", "\"x\" is not a width"},
        Case{"", "\"\" is not a width"},
        Case{"100000,100000,100000", "more than"}}) {
    const absl::Status s = ParseMlpDims(c.text, "--layers").status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_TRUE(absl::StartsWith(s.message(), "--layers: ")) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), c.what)) << c.text << ": " << s;
  }
}

}  // namespace
}  // namespace dp
