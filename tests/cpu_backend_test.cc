// CpuBackend against the independent float64 reference of
// tests/reference_mlp.h: loss, gradients (central differences), evaluation,
// input validation, determinism.
#include "worker/cpu_backend.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/model_layout.h"
#include "common/random.h"
#include "gtest/gtest.h"
#include "tests/reference_mlp.h"
#include "worker/backend.h"
#include "worker/backend_choice.h"

namespace dp {
namespace {

// Gradient tolerance, llm.c style: |backend - ref| <= kAtol + kRtol * |ref|.
// The backend works in float32 (relative error ~1e-6 on these sizes); the
// central difference with h = 1e-4 in float64 is exact to ~1e-8.
constexpr double kGradAtol = 1e-4;
constexpr double kGradRtol = 1e-3;
constexpr double kFiniteDiffH = 1e-4;
constexpr double kLossTol = 1e-5;

std::unique_ptr<Backend> MakeCpu(const ModelLayout& layout, int max_batch) {
  BackendOptions options;
  options.max_batch = max_batch;
  absl::StatusOr<std::unique_ptr<Backend>> b =
      CreateBackend("cpu", layout, options);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(b).value() : nullptr;
}

// The same, holding `params`.
std::unique_ptr<Backend> MakeCpu(const ModelLayout& layout, int max_batch,
                                 const std::vector<float>& params) {
  std::unique_ptr<Backend> b = MakeCpu(layout, max_batch);
  if (b != nullptr) EXPECT_TRUE(b->SetWeights(params).ok());
  return b;
}

// The backend's mean loss on `batch`, its gradient into *grad (num_params).
absl::StatusOr<float> LossAndGradient(Backend& backend, const MlpBatch& batch,
                                      std::vector<float>* grad) {
  return backend.ForwardBackward(batch.x, batch.labels, absl::MakeSpan(*grad));
}

// Compares the backend's gradient on `batch` with float64 central differences
// at the parameters listed in `which` (all when empty). Prints the first
// mismatches and returns how many there were. Parameters whose +-h
// perturbation flips a ReLU (a kink, where the difference quotient is not the
// derivative) are skipped and counted in *skipped.
int CountGradientMismatches(const ModelLayout& layout,
                            const std::vector<float>& params,
                            const MlpBatch& batch, int max_batch,
                            std::vector<int64_t> which, int* skipped) {
  std::unique_ptr<Backend> backend = MakeCpu(layout, max_batch, params);
  if (backend == nullptr) return -1;
  // NaN everywhere first: an entry the backend forgets to write shows up.
  std::vector<float> grad(layout.num_params(),
                          std::numeric_limits<float>::quiet_NaN());
  absl::StatusOr<float> loss = LossAndGradient(*backend, batch, &grad);
  EXPECT_TRUE(loss.ok()) << loss.status();
  if (!loss.ok()) return -1;

  if (which.empty()) {
    for (int64_t k = 0; k < layout.num_params(); ++k) which.push_back(k);
  }
  const std::vector<std::optional<double>> want =
      CentralDifferences(layout, ToDouble(params), batch, which, kFiniteDiffH);
  // The entries that are not at a kink, compared.
  std::vector<int64_t> checked;
  std::vector<double> got, ref;
  for (size_t i = 0; i < which.size(); ++i) {
    if (!want[i].has_value()) continue;
    checked.push_back(which[i]);
    got.push_back(grad[which[i]]);
    ref.push_back(*want[i]);
  }
  *skipped = static_cast<int>(which.size() - checked.size());
  const int mismatches = static_cast<int>(
      CompareWithTolerance(
          got, ref, kGradAtol, kGradRtol,
          [&](size_t i) { return ParamName(layout, checked[i]); }, "backend",
          "float64 reference")
          .mismatches);
  std::printf(
      "  batch %zu: %zu parameters checked, %d mismatches, %d skipped "
      "(ReLU kink)\n",
      batch.labels.size(), which.size() - *skipped, mismatches, *skipped);
  return mismatches;
}

const ModelLayout& SmallNet() {
  static const ModelLayout* layout =
      new ModelLayout(ModelLayout::Mlp({7, 5, 4, 3}));
  return *layout;
}

TEST(CpuBackendTest, GradientsMatchFloat64CentralDifferences) {
  const ModelLayout& layout = SmallNet();
  const std::vector<float> params = InitParams(layout, 11);
  const MlpBatch batch = RandomMlpBatch(layout, 6, 12);
  int skipped = 0;
  EXPECT_EQ(CountGradientMismatches(layout, params, batch, 8, {}, &skipped), 0);
  // Guard against a vacuous pass: almost every parameter must be checked.
  EXPECT_LE(skipped, layout.num_params() / 10);
}

TEST(CpuBackendTest, GradientsMatchOnADeeperNetWithOddSizes) {
  const ModelLayout layout = ModelLayout::Mlp({13, 17, 3, 9, 5});
  const std::vector<float> params = InitParams(layout, 21);
  const MlpBatch batch = RandomMlpBatch(layout, 5, 22);
  int skipped = 0;
  EXPECT_EQ(CountGradientMismatches(layout, params, batch, 5, {}, &skipped), 0);
  EXPECT_LE(skipped, layout.num_params() / 10);
}

TEST(CpuBackendTest, GradientsMatchWithoutHiddenLayers) {
  const ModelLayout layout = ModelLayout::Mlp({6, 4});  // softmax regression
  const std::vector<float> params = InitParams(layout, 31);
  const MlpBatch batch = RandomMlpBatch(layout, 3, 32);
  int skipped = 0;
  EXPECT_EQ(CountGradientMismatches(layout, params, batch, 4, {}, &skipped), 0);
  EXPECT_EQ(skipped, 0);
}

TEST(CpuBackendTest, LossMatchesFloat64Reference) {
  const ModelLayout& layout = SmallNet();
  const std::vector<float> params = InitParams(layout, 11);
  const MlpBatch batch = RandomMlpBatch(layout, 6, 12);
  std::unique_ptr<Backend> backend = MakeCpu(layout, 8, params);
  ASSERT_NE(backend, nullptr);
  std::vector<float> grad(layout.num_params());
  absl::StatusOr<float> loss = LossAndGradient(*backend, batch, &grad);
  ASSERT_TRUE(loss.ok()) << loss.status();
  const double ref = RefForward(layout, ToDouble(params), batch).loss;
  EXPECT_NEAR(*loss, ref, kLossTol);
}

TEST(CpuBackendTest, BatchOfOneAndMaxBatchBothWork) {
  const ModelLayout& layout = SmallNet();
  const std::vector<float> params = InitParams(layout, 41);
  constexpr int kMaxBatch = 9;
  for (int n : {1, kMaxBatch}) {
    const MlpBatch batch = RandomMlpBatch(layout, n, 42 + n);
    int skipped = 0;
    EXPECT_EQ(
        CountGradientMismatches(layout, params, batch, kMaxBatch, {}, &skipped),
        0)
        << "batch " << n;
    EXPECT_LE(skipped, layout.num_params() / 10) << "batch " << n;
  }
  // Both sizes through one backend, largest first, so stale rows of a bigger
  // batch cannot leak into a smaller one.
  std::unique_ptr<Backend> backend = MakeCpu(layout, kMaxBatch, params);
  ASSERT_NE(backend, nullptr);
  std::vector<float> grad(layout.num_params());
  for (int n : {kMaxBatch, 1, kMaxBatch}) {
    const MlpBatch batch = RandomMlpBatch(layout, n, 42 + n);
    absl::StatusOr<float> loss = LossAndGradient(*backend, batch, &grad);
    ASSERT_TRUE(loss.ok()) << loss.status();
    EXPECT_NEAR(*loss, RefForward(layout, ToDouble(params), batch).loss,
                kLossTol)
        << "batch " << n;
  }
}

TEST(CpuBackendTest, BadInputsAreInvalidArgument) {
  const ModelLayout& layout = SmallNet();  // input_dim 7, 3 classes
  std::unique_ptr<Backend> backend = MakeCpu(layout, 4);
  ASSERT_NE(backend, nullptr);
  const std::vector<float> params = InitParams(layout, 1);
  std::vector<float> grad(layout.num_params());
  auto fb = [&](size_t x_size, std::vector<int32_t> labels,
                size_t grad_size) -> absl::StatusCode {
    std::vector<float> x(x_size, 0.5f);
    std::vector<float> g(grad_size);
    return backend->ForwardBackward(x, labels, absl::MakeSpan(g))
        .status()
        .code();
  };
  const absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

  // Before any weights: a precondition, not an argument problem.
  EXPECT_EQ(fb(7, {0}, layout.num_params()),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(backend->Evaluate(std::vector<float>(7), std::vector<int32_t>{0})
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);

  EXPECT_EQ(backend->SetWeights(std::vector<float>(params.size() - 1)).code(),
            kInvalid);
  EXPECT_EQ(backend->SetWeights(std::vector<float>(params.size() + 1)).code(),
            kInvalid);
  ASSERT_TRUE(backend->SetWeights(params).ok());

  EXPECT_EQ(fb(14, {0, 1}, layout.num_params()), absl::StatusCode::kOk);
  EXPECT_EQ(fb(13, {0, 1}, layout.num_params()), kInvalid);  // x too short
  EXPECT_EQ(fb(15, {0, 1}, layout.num_params()), kInvalid);  // x too long
  EXPECT_EQ(fb(0, {}, layout.num_params()), kInvalid);       // empty batch
  // Five samples with max_batch 4.
  EXPECT_EQ(fb(35, {0, 0, 0, 0, 0}, layout.num_params()), kInvalid);
  EXPECT_EQ(fb(14, {0, 1}, layout.num_params() - 1), kInvalid);  // grad size
  EXPECT_EQ(fb(14, {0, 1}, layout.num_params() + 1), kInvalid);
  EXPECT_EQ(fb(14, {0, 3}, layout.num_params()), kInvalid);   // label == C
  EXPECT_EQ(fb(14, {-1, 0}, layout.num_params()), kInvalid);  // label < 0

  const absl::Status bad_label =
      backend
          ->ForwardBackward(std::vector<float>(14), std::vector<int32_t>{0, 3},
                            absl::MakeSpan(grad))
          .status();
  EXPECT_NE(bad_label.message().find("label 3"), absl::string_view::npos)
      << bad_label;

  EXPECT_EQ(
      backend->Evaluate(std::vector<float>(20), std::vector<int32_t>{0, 1, 2})
          .status()
          .code(),
      kInvalid);
  EXPECT_EQ(
      backend->Evaluate(std::vector<float>(21), std::vector<int32_t>{0, 1, 7})
          .status()
          .code(),
      kInvalid);
  // An empty evaluation is valid and counts nothing.
  absl::StatusOr<EvalResult> empty =
      backend->Evaluate(std::vector<float>(), std::vector<int32_t>());
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->count, 0);
  EXPECT_EQ(empty->correct, 0);
}

TEST(CpuBackendTest, CreateBackendByName) {
  const ModelLayout& layout = SmallNet();
  BackendOptions options;
  options.max_batch = 4;
  absl::StatusOr<std::unique_ptr<Backend>> cpu =
      CreateBackend("cpu", layout, options);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ((*cpu)->Name(), "cpu");
  // "auto" always yields something: a GPU backend or the CPU fallback.
  absl::StatusOr<std::unique_ptr<Backend>> any =
      CreateBackend("auto", layout, options);
  EXPECT_TRUE(any.ok()) << any.status();
  // "cuda" either works or says why not; it is never an argument error.
  absl::StatusOr<std::unique_ptr<Backend>> cuda =
      CreateBackend("cuda", layout, options);
  if (!cuda.ok()) {  // no module (NOT_FOUND), or it cannot run here
    EXPECT_TRUE(cuda.status().code() == absl::StatusCode::kNotFound ||
                cuda.status().code() == absl::StatusCode::kFailedPrecondition)
        << cuda.status();
    EXPECT_FALSE(cuda.status().message().empty());
  }
  absl::StatusOr<std::unique_ptr<Backend>> bogus =
      CreateBackend("tpu", layout, options);
  EXPECT_EQ(bogus.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bogus.status().message().find("cpu"), absl::string_view::npos)
      << bogus.status();

  options.max_batch = 0;
  EXPECT_EQ(CreateBackend("cpu", layout, options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CpuBackendTest, EvaluateMatchesReferenceArgmaxAndLoss) {
  const ModelLayout& layout = SmallNet();
  const std::vector<float> params = InitParams(layout, 51);
  // 21 samples with max_batch 8: chunks of 8, 8 and 5.
  const MlpBatch batch = RandomMlpBatch(layout, 21, 52);
  std::unique_ptr<Backend> backend = MakeCpu(layout, 8, params);
  ASSERT_NE(backend, nullptr);
  absl::StatusOr<EvalResult> got = backend->Evaluate(batch.x, batch.labels);
  ASSERT_TRUE(got.ok()) << got.status();

  const Reference ref = RefForward(layout, ToDouble(params), batch);
  const int C = layout.num_classes();
  int64_t want_correct = 0;
  double want_loss = 0.0;
  for (size_t s = 0; s < batch.labels.size(); ++s) {
    const double* z = ref.logits.data() + s * C;
    int arg = 0;
    for (int j = 1; j < C; ++j) {
      if (z[j] > z[arg]) arg = j;
    }
    // The data must not hold near-ties, where float and float64 may disagree.
    for (int j = 0; j < C; ++j) {
      if (j != arg) {
        ASSERT_GT(z[arg] - z[j], 1e-4) << "near-tie in sample " << s;
      }
    }
    want_correct += arg == batch.labels[s];
    want_loss += ref.losses[s];
  }
  EXPECT_EQ(got->count, 21);
  EXPECT_EQ(got->correct, want_correct);
  EXPECT_GT(want_correct, 0);  // so that the comparison says something
  EXPECT_NEAR(got->loss_sum, want_loss, 21 * kLossTol);
}

TEST(CpuBackendTest, EvaluateTiesGoToTheLowestClass) {
  const ModelLayout& layout = SmallNet();
  std::unique_ptr<Backend> backend = MakeCpu(layout, 4);
  ASSERT_NE(backend, nullptr);
  // Zero weights: every logit is 0, so argmax is class 0 for every sample
  // and each loss is exactly ln(3).
  ASSERT_TRUE(
      backend->SetWeights(std::vector<float>(layout.num_params(), 0.0f)).ok());
  const std::vector<int32_t> labels = {0, 1, 2, 0, 2, 0, 1};
  absl::StatusOr<EvalResult> got =
      backend->Evaluate(std::vector<float>(labels.size() * 7, 1.0f), labels);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->count, 7);
  EXPECT_EQ(got->correct, 3);
  EXPECT_NEAR(got->loss_sum, 7 * std::log(3.0), 1e-5);
}

TEST(CpuBackendTest, EvaluateAgreesWithForwardBackwardLoss) {
  const ModelLayout& layout = SmallNet();
  const std::vector<float> params = InitParams(layout, 61);
  const MlpBatch batch = RandomMlpBatch(layout, 8, 62);
  std::unique_ptr<Backend> backend = MakeCpu(layout, 8, params);
  ASSERT_NE(backend, nullptr);
  std::vector<float> grad(layout.num_params());
  absl::StatusOr<float> loss = LossAndGradient(*backend, batch, &grad);
  absl::StatusOr<EvalResult> eval = backend->Evaluate(batch.x, batch.labels);
  ASSERT_TRUE(loss.ok() && eval.ok());
  EXPECT_NEAR(eval->loss_sum / eval->count, *loss, 1e-6);
}

TEST(CpuBackendTest, SameInputGivesBitwiseIdenticalGradients) {
  const ModelLayout layout = ModelLayout::SimpleNet();
  const std::vector<float> params = InitParams(layout, 71);
  const MlpBatch batch = RandomMlpBatch(layout, 32, 72);
  const MlpBatch other = RandomMlpBatch(layout, 64, 73);
  std::unique_ptr<Backend> backend = MakeCpu(layout, 64, params);
  ASSERT_NE(backend, nullptr);
  std::vector<float> first(layout.num_params()), second(layout.num_params()),
      scratch(layout.num_params());
  absl::StatusOr<float> loss1 = LossAndGradient(*backend, batch, &first);
  // A different, larger batch in between must leave no trace.
  ASSERT_TRUE(LossAndGradient(*backend, other, &scratch).ok());
  absl::StatusOr<float> loss2 = LossAndGradient(*backend, batch, &second);
  ASSERT_TRUE(loss1.ok() && loss2.ok());
  EXPECT_EQ(std::memcmp(&*loss1, &*loss2, sizeof(float)), 0);
  int64_t differing = 0;
  for (size_t k = 0; k < first.size(); ++k) {
    differing += std::memcmp(&first[k], &second[k], sizeof(float)) != 0;
  }
  EXPECT_EQ(differing, 0) << "of " << first.size() << " gradient entries";
}

TEST(CpuBackendTest, TakeWeightsIsSetWeightsWithoutTheCopy) {
  const ModelLayout layout = ModelLayout::SimpleNet();
  const std::vector<float> params = InitParams(layout, 81);
  const MlpBatch batch = RandomMlpBatch(layout, 16, 82);
  std::unique_ptr<Backend> set = MakeCpu(layout, 16);
  std::unique_ptr<Backend> taken = MakeCpu(layout, 16);
  ASSERT_TRUE(set != nullptr && taken != nullptr);
  ASSERT_TRUE(set->SetWeights(params).ok());
  std::vector<float> buffer = params;
  ASSERT_TRUE(taken->TakeWeights(&buffer).ok());
  EXPECT_EQ(buffer.size(), params.size()) << "a same-sized buffer comes back";
  std::vector<float> g1(layout.num_params()), g2(layout.num_params());
  auto l1 = LossAndGradient(*set, batch, &g1);
  auto l2 = LossAndGradient(*taken, batch, &g2);
  ASSERT_TRUE(l1.ok() && l2.ok());
  EXPECT_EQ(*l1, *l2);
  EXPECT_EQ(std::memcmp(g1.data(), g2.data(), g1.size() * sizeof(float)), 0);
  // The wrong size is refused, and the weights stay.
  std::vector<float> shorter(layout.num_params() - 1, 0.0f);
  EXPECT_EQ(taken->TakeWeights(&shorter).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shorter.size(), layout.num_params() - 1);
  auto l3 = LossAndGradient(*taken, batch, &g2);
  ASSERT_TRUE(l3.ok());
  EXPECT_EQ(std::memcmp(g1.data(), g2.data(), g1.size() * sizeof(float)), 0);
}

// Each tensor of `params` copied into `memory` at its own place, `skew`
// floats past a 64-byte boundary and apart from the one before (shared
// memory puts them 64 bytes apart; a worker's own buffer anywhere): the
// spans ViewWeights takes.
std::vector<absl::Span<const float>> ScatteredTensors(
    const ModelLayout& layout, const std::vector<float>& params, int skew,
    std::vector<float>* memory) {
  memory->assign(params.size() + 32 * layout.tensors().size() + 16, NAN);
  float* at = memory->data();
  while (reinterpret_cast<uintptr_t>(at) % 64 != 0) ++at;
  std::vector<absl::Span<const float>> tensors;
  for (const TensorInfo& t : layout.tensors()) {
    at += skew;
    std::copy(params.begin() + t.offset, params.begin() + t.offset + t.size,
              at);
    tensors.emplace_back(at, t.size);
    at += t.size + 16;
  }
  return tensors;
}

// What the worker computes from weights it views in shared memory is what it
// computes from its own copy, bit for bit, wherever the tensors lie: the
// model of a job does not depend on its data plane.
TEST(CpuBackendTest, ViewedWeightsGiveTheGradientsOfOwnedOnesBitForBit) {
  const ModelLayout layout = ModelLayout::SimpleNet();
  const std::vector<float> params = InitParams(layout, 91);
  std::unique_ptr<Backend> owned = MakeCpu(layout, 64);
  std::unique_ptr<Backend> viewed = MakeCpu(layout, 64);
  ASSERT_TRUE(owned != nullptr && viewed != nullptr);
  ASSERT_TRUE(owned->SetWeights(params).ok());
  const int64_t n = layout.num_params();
  for (int batch : {1, 7, 64}) {
    const MlpBatch b = RandomMlpBatch(layout, batch, 92 + batch);
    std::vector<float> want(n);
    auto want_loss = LossAndGradient(*owned, b, &want);
    ASSERT_TRUE(want_loss.ok());
    auto want_eval = owned->Evaluate(b.x, b.labels);
    ASSERT_TRUE(want_eval.ok());
    for (int skew : {0, 1, 3, 8}) {
      SCOPED_TRACE(::testing::Message()
                   << "batch " << batch << ", skew " << skew);
      std::vector<float> memory;
      const std::vector<absl::Span<const float>> tensors =
          ScatteredTensors(layout, params, skew, &memory);
      ASSERT_TRUE(viewed->ViewWeights(tensors).ok());
      std::vector<float> got(n, NAN);
      auto loss = LossAndGradient(*viewed, b, &got);
      ASSERT_TRUE(loss.ok());
      EXPECT_EQ(std::memcmp(&*loss, &*want_loss, sizeof(float)), 0);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0);
      auto eval = viewed->Evaluate(b.x, b.labels);
      ASSERT_TRUE(eval.ok());
      EXPECT_EQ(eval->correct, want_eval->correct);
      EXPECT_EQ(
          std::memcmp(&eval->loss_sum, &want_eval->loss_sum, sizeof(double)),
          0);
    }
  }
}

// A view is not a copy: the backend computes from the memory as it is at
// each call, and SetWeights makes it compute from its own copy again.
TEST(CpuBackendTest, AViewIsReadWhereItLies) {
  const ModelLayout layout = ModelLayout::SimpleNet();
  const std::vector<float> first = InitParams(layout, 93);
  const std::vector<float> second = InitParams(layout, 94);
  const MlpBatch b = RandomMlpBatch(layout, 8, 95);
  const int64_t n = layout.num_params();
  std::unique_ptr<Backend> backend = MakeCpu(layout, 8);
  ASSERT_TRUE(backend != nullptr);
  auto gradient = [&](const std::vector<float>& p) {
    std::vector<float> g(n);
    EXPECT_TRUE(backend->SetWeights(p).ok());
    EXPECT_TRUE(LossAndGradient(*backend, b, &g).ok());
    return g;
  };
  const std::vector<float> of_first = gradient(first);
  const std::vector<float> of_second = gradient(second);
  ASSERT_NE(of_first, of_second);
  std::vector<float> memory = first;
  std::vector<absl::Span<const float>> tensors;
  for (const TensorInfo& t : layout.tensors()) {
    tensors.emplace_back(memory.data() + t.offset, t.size);
  }
  ASSERT_TRUE(backend->ViewWeights(tensors).ok());
  std::vector<float> g(n);
  ASSERT_TRUE(LossAndGradient(*backend, b, &g).ok());
  EXPECT_EQ(g, of_first);
  memory = second;  // same buffer, new values
  ASSERT_TRUE(LossAndGradient(*backend, b, &g).ok());
  EXPECT_EQ(g, of_second) << "the backend computed from a copy";
  ASSERT_TRUE(backend->SetWeights(first).ok());
  std::fill(memory.begin(), memory.end(), NAN);
  ASSERT_TRUE(LossAndGradient(*backend, b, &g).ok());
  EXPECT_EQ(g, of_first) << "SetWeights left the backend on the view";
}

TEST(CpuBackendTest, AViewOfTheWrongShapeIsInvalidArgument) {
  const ModelLayout layout = ModelLayout::SimpleNet();
  std::unique_ptr<Backend> backend = MakeCpu(layout, 8);
  ASSERT_TRUE(backend != nullptr);
  std::vector<float> memory(layout.num_params(), 0.0f);
  std::vector<absl::Span<const float>> tensors;
  for (const TensorInfo& t : layout.tensors()) {
    tensors.emplace_back(memory.data() + t.offset, t.size);
  }
  std::vector<absl::Span<const float>> fewer(tensors.begin(),
                                             tensors.end() - 1);
  const absl::Status missing = backend->ViewWeights(fewer);
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.message().find("fc3.bias"), std::string::npos) << missing;
  std::vector<absl::Span<const float>> shorter = tensors;
  shorter[2] = shorter[2].subspan(1);
  const absl::Status wrong = backend->ViewWeights(shorter);
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.message().find("fc2.weight"), std::string::npos) << wrong;
  // Neither counts as weights.
  const MlpBatch b = RandomMlpBatch(layout, 2, 96);
  std::vector<float> g(layout.num_params());
  EXPECT_EQ(LossAndGradient(*backend, b, &g).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// A backend that keeps the default ViewWeights (the CUDA one, which uploads
// anyway) is handed one flat copy of the tensors in order; where they lie
// in one piece already, that piece itself.
class RecordingBackend : public Backend {
 public:
  std::string Name() const override { return "recording"; }
  absl::Status SetWeights(absl::Span<const float> params) override {
    set.assign(params.begin(), params.end());
    set_from = params.data();
    return absl::OkStatus();
  }
  absl::StatusOr<float> ForwardBackward(absl::Span<const float>,
                                        absl::Span<const int32_t>,
                                        absl::Span<float>) override {
    return 0.0f;
  }
  absl::StatusOr<EvalResult> Evaluate(absl::Span<const float>,
                                      absl::Span<const int32_t>) override {
    return EvalResult{};
  }
  std::vector<float> set;
  const float* set_from = nullptr;
};

TEST(BackendTest, TheDefaultViewSetsACopyOfTheTensorsInOrder) {
  const ModelLayout layout = ModelLayout::Mlp({3, 4, 2});
  const std::vector<float> params = InitParams(layout, 97);
  std::vector<float> memory;
  RecordingBackend backend;
  ASSERT_TRUE(
      backend.ViewWeights(ScatteredTensors(layout, params, 1, &memory)).ok());
  EXPECT_EQ(backend.set, params);
  std::vector<absl::Span<const float>> in_one_piece;
  for (const TensorInfo& t : layout.tensors()) {
    in_one_piece.emplace_back(params.data() + t.offset, t.size);
  }
  ASSERT_TRUE(backend.ViewWeights(in_one_piece).ok());
  EXPECT_EQ(backend.set, params);
  EXPECT_EQ(backend.set_from, params.data()) << "copied before SetWeights";
}

TEST(CpuBackendTest, SimpleNetLossAtInitIsNearLn10) {
  const ModelLayout layout = ModelLayout::SimpleNet();
  const std::vector<float> params = InitParams(layout, 81);
  // Pixel-like inputs in [0, 1) with uniform labels: at PyTorch's default
  // init the logits are small, so the softmax is near uniform.
  Rng rng(82, 0);
  MlpBatch batch;
  for (int i = 0; i < 256 * 784; ++i) {
    batch.x.push_back(static_cast<float>(rng.Uniform()));
  }
  for (int i = 0; i < 256; ++i) batch.labels.push_back(i % 10);
  std::unique_ptr<Backend> backend = MakeCpu(layout, 256, params);
  ASSERT_NE(backend, nullptr);
  std::vector<float> grad(layout.num_params());
  absl::StatusOr<float> loss = LossAndGradient(*backend, batch, &grad);
  ASSERT_TRUE(loss.ok()) << loss.status();
  std::printf("  SimpleNet loss at init: %.6f (ln 10 = %.6f)\n", *loss,
              std::log(10.0));
  EXPECT_NEAR(*loss, std::log(10.0), 0.02);
  EXPECT_NEAR(*loss, RefForward(layout, ToDouble(params), batch).loss,
              kLossTol);
}

TEST(CpuBackendTest, SimpleNetGradientSpotCheck) {
  // Full size, real shapes: central differences at 80 parameters spread over
  // all six tensors (first and last entry of each, the rest at random).
  const ModelLayout layout = ModelLayout::SimpleNet();
  const std::vector<float> params = InitParams(layout, 91);
  const MlpBatch batch = RandomMlpBatch(layout, 4, 92);
  std::vector<int64_t> which;
  Rng rng(93, 0);
  for (const TensorInfo& t : layout.tensors()) {
    which.push_back(t.offset);
    which.push_back(t.offset + t.size - 1);
    for (int i = 0; i < 12; ++i) {
      which.push_back(t.offset + static_cast<int64_t>(rng.Below(t.size)));
    }
  }
  int skipped = 0;
  EXPECT_EQ(CountGradientMismatches(layout, params, batch, 8, which, &skipped),
            0);
  EXPECT_LE(skipped, static_cast<int>(which.size()) / 10);
}

}  // namespace
}  // namespace dp
