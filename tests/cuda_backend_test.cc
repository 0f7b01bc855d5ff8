// CudaBackend against the CPU reference (CpuBackend and the loops of
// worker/cpu_backend.cc): each fused kernel, the whole forward+backward,
// evaluation, determinism, input validation. Every test that needs a GPU
// skips, saying why, where there is none or in a build without CUDA.
//
// Tolerances, llm.c style: a value passes when |cuda - cpu| <= atol + rtol *
// |cpu|; failures are counted and the first ones printed.
#include "worker/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/model_layout.h"
#include "common/random.h"
#include "gtest/gtest.h"
#include "tests/reference_mlp.h"
#include "worker/backend.h"
#include "worker/backend_choice.h"
#include "worker/cpu_backend.h"
#ifdef DP_HAVE_CUDA
#include "worker/cuda_kernels_testing.h"
#endif

namespace dp {
namespace {

#ifndef DP_HAVE_CUDA

TEST(CudaBackendTest, NeedsACudaBuild) {
  GTEST_SKIP() << "built without CUDA (nvcc not found or "
                  "-DDP_ENABLE_CUDA=OFF): no CUDA backend to test";
}

TEST(CudaBackendTest, CudaBackendByNameSaysWhyItCannotRun) {
  const ModelLayout layout = ModelLayout::SimpleNet();
  auto backend = CreateBackend("cuda", layout, BackendOptions());
  ASSERT_FALSE(backend.ok());
  // No module next to this test binary, or one that finds no GPU.
  EXPECT_TRUE(backend.status().code() == absl::StatusCode::kNotFound ||
              backend.status().code() == absl::StatusCode::kFailedPrecondition)
      << backend.status();
  EXPECT_EQ(backend.status().message().rfind("backend \"cuda\": ", 0), 0u)
      << backend.status();
}

#else  // DP_HAVE_CUDA

// Gradients: rtol 1e-5 is the contract (float32 parity). The entries of these
// gradients are O(1e-5..1e-1); two float32 sums of the same terms in a
// different order differ by about eps * sqrt(K) relative to the sum of the
// magnitudes, a few 1e-9 here, so atol 1e-6 only matters for entries that
// nearly cancel, and is still 100x below a typical entry. The inputs are
// drawn so that no ReLU input lies within kKinkMargin of 0 (see
// DrawBatch): otherwise a rounding difference could flip a ReLU and change
// a gradient row legitimately.
constexpr double kGradAtol = 1e-6;
constexpr double kGradRtol = 1e-5;
// Per tensor, ||cuda - cpu|| / ||cpu|| must also stay below this: an error
// spread over a whole tensor is a bug even when every entry passes.
constexpr double kGradRelL2 = 1e-5;
// Mean loss over the batch, absolute (the loss is about ln 10 = 2.3).
constexpr double kLossTol = 1e-6;
// Minimum |pre-activation| of every ReLU and minimum gap between the two
// largest logits in the test batches (float64 forward).
constexpr double kKinkMargin = 1e-4;
// Column sums: |sum - exact| <= kSumRtol * sum_i |term_i| (float32 rounding
// of a sum of n terms, either order, is ~eps * sqrt(n) of that).
constexpr double kSumRtol = 1e-6;

// Only a missing driver or device skips: a GPU this build has no code for
// fails every test that needs one.
bool GpuUsable(std::string* why) {
  absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok()) *why = std::string(count.status().message());
  return count.ok();
}

#define SKIP_WITHOUT_GPU()                                   \
  do {                                                       \
    std::string why_no_gpu;                                  \
    if (!GpuUsable(&why_no_gpu)) GTEST_SKIP() << why_no_gpu; \
  } while (0)

// ---------------------------------------------------------------------------
// Comparisons (tests/reference_mlp.h's mixed tolerance).

Comparison CompareFlat(const char* what, absl::Span<const float> got,
                       absl::Span<const float> want, double atol, double rtol) {
  return CompareWithTolerance(
      ToDouble(got), ToDouble(want), atol, rtol,
      [&](size_t i) { return absl::StrCat(what, "[", i, "]"); }, "cuda", "cpu");
}

// Compares two flat gradients tensor by tensor; returns total mismatches.
int64_t CompareGradients(const ModelLayout& layout,
                         const std::vector<float>& got,
                         const std::vector<float>& want) {
  int64_t total = 0;
  for (const TensorInfo& t : layout.tensors()) {
    absl::Span<const float> g(got.data() + t.offset, t.size);
    absl::Span<const float> w(want.data() + t.offset, t.size);
    const Comparison c =
        CompareFlat(t.name.c_str(), g, w, kGradAtol, kGradRtol);
    const double rel_l2 = std::sqrt(c.diff_l2 / std::max(c.ref_l2, 1e-300));
    std::printf(
        "  %-11s %7lld values: %lld mismatches, max |diff| %.3g, "
        "rel L2 %.3g\n",
        t.name.c_str(), static_cast<long long>(t.size),
        static_cast<long long>(c.mismatches), c.max_abs, rel_l2);
    EXPECT_LE(rel_l2, kGradRelL2) << t.name;
    total += c.mismatches;
  }
  return total;
}

// ---------------------------------------------------------------------------
// Test data: batches of tests/reference_mlp.h, no sample within kKinkMargin
// of a kink.

MlpBatch DrawBatch(const ModelLayout& layout, const std::vector<float>& params,
                   int n, uint64_t seed) {
  return MlpBatchFarFromKinks(layout, params, n, seed, kKinkMargin);
}

std::vector<float> RandomVector(size_t n, uint64_t seed, double scale) {
  Rng rng(seed, 3);
  std::vector<float> v(n);
  for (float& f : v) f = static_cast<float>(scale * rng.Normal());
  return v;
}

std::unique_ptr<CpuBackend> MakeCpu(const ModelLayout& layout, int max_batch) {
  BackendOptions options;
  options.max_batch = max_batch;
  auto cpu = CpuBackend::Create(layout, options);
  EXPECT_TRUE(cpu.ok()) << cpu.status();
  return cpu.ok() ? std::move(cpu).value() : nullptr;
}

std::unique_ptr<CudaBackend> MakeCuda(const ModelLayout& layout, int max_batch,
                                      bool graphs = true, bool tf32 = false,
                                      bool fail_captures = false) {
  BackendOptions options;
  options.max_batch = max_batch;
  options.tf32 = tf32;
  CudaOptions cuda_options;
  cuda_options.graphs = graphs;
  cuda_options.fail_captures_for_testing = fail_captures;
  auto cuda = CudaBackend::Create(layout, options, cuda_options);
  EXPECT_TRUE(cuda.ok()) << cuda.status();
  return cuda.ok() ? std::move(cuda).value() : nullptr;
}

// ---------------------------------------------------------------------------
// Without a GPU (these run everywhere).

TEST(CudaBackendTest, MaxBatchBelowOneIsInvalidArgument) {
  BackendOptions options;
  options.max_batch = 0;
  auto cuda = CudaBackend::Create(ModelLayout::SimpleNet(), options);
  ASSERT_FALSE(cuda.ok());
  EXPECT_EQ(cuda.status().code(), absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------
// Kernels against the loops of worker/cpu_backend.cc, copied here.

TEST(CudaKernelTest, BiasReluIsBitwiseTheCpuLoop) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int B, out;
  };
  // out % 4 == 0 takes the float4 path, the others the scalar one.
  for (const Case& k :
       {Case{1, 256}, Case{63, 128}, Case{64, 10}, Case{1000, 7}, Case{5, 1}}) {
    for (bool relu : {true, false}) {
      SCOPED_TRACE(absl::StrCat("B=", k.B, " out=", k.out, " relu=", relu));
      const size_t n = static_cast<size_t>(k.B) * k.out;
      std::vector<float> y = RandomVector(n, 100 + k.B, 1.0);
      const std::vector<float> bias = RandomVector(k.out, 200 + k.out, 0.5);
      std::vector<float> want = y;
      for (size_t i = 0; i < n; ++i) {
        const float v = want[i] + bias[i % k.out];
        want[i] = relu ? (v < 0.0f ? 0.0f : v) : v;
      }
      ASSERT_TRUE(
          CudaBiasReluForTest(absl::MakeSpan(y), bias, k.B, k.out, relu).ok());
      EXPECT_EQ(std::memcmp(y.data(), want.data(), n * sizeof(float)), 0);
    }
  }
}

TEST(CudaKernelTest, SoftmaxCrossEntropyMatchesTheCpuLoop) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int B, C;
  };
  // C = 100 spreads a row over several columns per lane.
  for (const Case& k : {Case{1, 10}, Case{63, 10}, Case{64, 7}, Case{1000, 10},
                        Case{33, 100}}) {
    SCOPED_TRACE(absl::StrCat("B=", k.B, " C=", k.C));
    const size_t n = static_cast<size_t>(k.B) * k.C;
    std::vector<float> logits = RandomVector(n, 300 + k.B, 2.0);
    logits[0] = 80.0f;  // exp would overflow without the max shift
    std::vector<int32_t> labels(k.B);
    Rng rng(400 + k.B, 0);
    for (int32_t& l : labels) l = static_cast<int32_t>(rng.Below(k.C));

    // cpu_backend.cc: SoftmaxCrossEntropy with ExpRow.
    std::vector<float> want_dz(n), want_loss(k.B);
    const float inv_b = 1.0f / static_cast<float>(k.B);
    for (int i = 0; i < k.B; ++i) {
      const float* z = logits.data() + static_cast<size_t>(i) * k.C;
      float* dz = want_dz.data() + static_cast<size_t>(i) * k.C;
      float m = z[0];
      for (int j = 1; j < k.C; ++j) m = std::max(m, z[j]);
      float s = 0.0f;
      for (int j = 0; j < k.C; ++j) s += (dz[j] = std::exp(z[j] - m));
      want_loss[i] = (m + std::log(s)) - z[labels[i]];
      const float scale = inv_b / s;
      for (int j = 0; j < k.C; ++j) dz[j] *= scale;
      dz[labels[i]] -= inv_b;
    }

    std::vector<float> dz(n), loss(k.B);
    ASSERT_TRUE(CudaSoftmaxCrossEntropyForTest(logits, labels, k.B, k.C,
                                               absl::MakeSpan(dz),
                                               absl::MakeSpan(loss))
                    .ok());
    // expf/logf differ from glibc's by a few ulp; the sum order differs.
    EXPECT_EQ(CompareFlat("dlogits", dz, want_dz, 1e-12, kGradRtol).mismatches,
              0);
    EXPECT_EQ(
        CompareFlat("row_loss", loss, want_loss, kLossTol, 1e-6).mismatches, 0);
  }
}

TEST(CudaKernelTest, ColumnSumsOfIntegersAreExact) {
  SKIP_WITHOUT_GPU();
  // Integer values: every partial sum is exact in float32, whatever the
  // order, so the sums must be exact. Sizes cross the chunk (128 rows) and
  // tile (32 columns) boundaries.
  for (int B : {1, 63, 64, 128, 129, 1000, 4096}) {
    for (int out : {10, 33, 256}) {
      SCOPED_TRACE(absl::StrCat("B=", B, " out=", out));
      const size_t n = static_cast<size_t>(B) * out;
      Rng rng(B * 1000 + out, 5);
      std::vector<float> dy(n);
      for (float& v : dy) v = static_cast<float>(rng.Below(201)) - 100.0f;
      std::vector<float> want(out, 0.0f);
      for (size_t i = 0; i < n; ++i) want[i % out] += dy[i];
      std::vector<float> db(out);
      ASSERT_TRUE(CudaColumnSumsForTest(absl::MakeSpan(dy), {}, B, out,
                                        absl::MakeSpan(db))
                      .ok());
      EXPECT_EQ(CompareFlat("db", db, want, 0.0, 0.0).mismatches, 0);
    }
  }
}

TEST(CudaKernelTest, ReluBackwardColumnSumsMatchTheCpuLoops) {
  SKIP_WITHOUT_GPU();
  for (int B : {1, 63, 64, 1000}) {
    for (int out : {13, 128, 256}) {
      SCOPED_TRACE(absl::StrCat("B=", B, " out=", out));
      const size_t n = static_cast<size_t>(B) * out;
      std::vector<float> dy = RandomVector(n, 500 + B, 1e-3);
      std::vector<float> act = RandomVector(n, 600 + out, 1.0);
      for (size_t i = 0; i < n; i += 7) act[i] = 0.0f;  // ReLU's exact zeros
      for (float& a : act) a = a < 0.0f ? 0.0f : a;
      // cpu_backend.cc: the mask of LinearReluBackwardInput, then ColumnSums;
      // the sums also in float64 with the sum of magnitudes.
      std::vector<float> want_dy(n);
      std::vector<double> exact(out, 0.0), magnitude(out, 0.0);
      for (size_t i = 0; i < n; ++i) {
        want_dy[i] = act[i] <= 0.0f ? 0.0f : dy[i];
        exact[i % out] += want_dy[i];
        magnitude[i % out] += std::fabs(want_dy[i]);
      }
      std::vector<float> db(out);
      ASSERT_TRUE(CudaColumnSumsForTest(absl::MakeSpan(dy), act, B, out,
                                        absl::MakeSpan(db))
                      .ok());
      EXPECT_EQ(std::memcmp(dy.data(), want_dy.data(), n * sizeof(float)), 0)
          << "masked dy differs";
      int64_t bad = 0;
      for (int c = 0; c < out; ++c) {
        const double err = std::fabs(db[c] - exact[c]);
        if (!(err <= kSumRtol * magnitude[c] + 1e-30)) {
          if (bad < 10) {
            std::printf("  mismatch db[%d]: cuda %.9g exact %.12g |err| %.3g\n",
                        c, db[c], exact[c], err);
          }
          ++bad;
        }
      }
      EXPECT_EQ(bad, 0);
    }
  }
}

TEST(CudaKernelTest, EvalRowsArgmaxTiesGoToTheLowestClass) {
  SKIP_WITHOUT_GPU();
  for (int C : {10, 3, 45}) {
    const int B = 200;
    SCOPED_TRACE(absl::StrCat("C=", C));
    // Small integers: many ties.
    Rng rng(700 + C, 0);
    std::vector<float> logits(static_cast<size_t>(B) * C);
    for (float& v : logits) v = static_cast<float>(rng.Below(4));
    std::vector<int32_t> labels(B);
    for (int32_t& l : labels) l = static_cast<int32_t>(rng.Below(C));
    std::vector<float> want_loss(B);
    std::vector<int32_t> want_correct(B);
    for (int i = 0; i < B; ++i) {  // cpu_backend.cc: Evaluate's row loop
      const float* z = logits.data() + static_cast<size_t>(i) * C;
      int arg = 0;
      for (int j = 1; j < C; ++j) {
        if (z[j] > z[arg]) arg = j;
      }
      want_correct[i] = arg == labels[i];
      float m = z[0];
      for (int j = 1; j < C; ++j) m = std::max(m, z[j]);
      float s = 0.0f;
      for (int j = 0; j < C; ++j) s += std::exp(z[j] - m);
      want_loss[i] = (m + std::log(s)) - z[labels[i]];
    }
    std::vector<float> loss(B);
    std::vector<int32_t> correct(B);
    ASSERT_TRUE(CudaEvalRowsForTest(logits, labels, B, C, absl::MakeSpan(loss),
                                    absl::MakeSpan(correct))
                    .ok());
    EXPECT_EQ(correct, want_correct);
    EXPECT_EQ(
        CompareFlat("row_loss", loss, want_loss, kLossTol, 1e-6).mismatches, 0);
  }
}

TEST(CudaKernelTest, EvalRowsArgmaxTreatsNaNAsTheCpuLoop) {
  SKIP_WITHOUT_GPU();
  const int C = 45;  // more columns than lanes: NaNs on several lanes
  const int B = 64;
  Rng rng(771, 0);
  std::vector<float> logits(static_cast<size_t>(B) * C);
  for (float& v : logits) v = static_cast<float>(rng.Below(5));
  for (int i = 0; i < B; ++i) {
    float* z = logits.data() + static_cast<size_t>(i) * C;
    // Row i: NaN in column 0 for odd rows, and in 1 + i % 7 more columns.
    if (i % 2 == 1) z[0] = NAN;
    for (int k = 0; k < 1 + i % 7; ++k) z[rng.Below(C)] = NAN;
    if (i % 8 == 0) std::fill(z, z + C, NAN);  // all NaN
  }
  std::vector<int32_t> labels(B), want_arg(B);
  for (int i = 0; i < B; ++i) {  // cpu_backend.cc: Evaluate's argmax loop
    const float* z = logits.data() + static_cast<size_t>(i) * C;
    int arg = 0;
    for (int j = 1; j < C; ++j) {
      if (z[j] > z[arg]) arg = j;
    }
    want_arg[i] = arg;
  }
  // Each row twice, once labelled with the CPU's argmax (must be correct)
  // and once with the next class (must not be).
  for (int shift : {0, 1}) {
    for (int i = 0; i < B; ++i) labels[i] = (want_arg[i] + shift) % C;
    std::vector<float> loss(B);
    std::vector<int32_t> correct(B);
    ASSERT_TRUE(CudaEvalRowsForTest(logits, labels, B, C, absl::MakeSpan(loss),
                                    absl::MakeSpan(correct))
                    .ok());
    for (int i = 0; i < B; ++i) {
      EXPECT_EQ(correct[i], shift == 0 ? 1 : 0)
          << "row " << i << ", cpu argmax " << want_arg[i];
    }
  }
}

// ---------------------------------------------------------------------------
// The whole backend against CpuBackend.

struct ParityCase {
  const char* model;
  std::vector<int> dims;
  int batch;
};

std::string ParityName(const testing::TestParamInfo<ParityCase>& info) {
  return absl::StrCat(info.param.model, "_B", info.param.batch);
}

class CudaParityTest : public testing::TestWithParam<ParityCase> {};

TEST_P(CudaParityTest, ForwardBackwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const ParityCase& p = GetParam();
  const ModelLayout layout = ModelLayout::Mlp(p.dims);
  const std::vector<float> params = InitParams(layout, 42 + p.batch);
  const MlpBatch batch = DrawBatch(layout, params, p.batch, 1000 + p.batch);
  auto cpu = MakeCpu(layout, 1000);
  auto cuda = MakeCuda(layout, 1000);
  ASSERT_TRUE(cpu && cuda);
  ASSERT_TRUE(cpu->SetWeights(params).ok());
  ASSERT_TRUE(cuda->SetWeights(params).ok());
  std::vector<float> want(layout.num_params()), got(layout.num_params());
  auto want_loss =
      cpu->ForwardBackward(batch.x, batch.labels, absl::MakeSpan(want));
  auto got_loss =
      cuda->ForwardBackward(batch.x, batch.labels, absl::MakeSpan(got));
  ASSERT_TRUE(want_loss.ok()) << want_loss.status();
  ASSERT_TRUE(got_loss.ok()) << got_loss.status();
  std::printf("%s, batch %d: loss cuda %.9g cpu %.9g\n", p.model, p.batch,
              *got_loss, *want_loss);
  EXPECT_NEAR(*got_loss, *want_loss, kLossTol);
  EXPECT_EQ(CompareGradients(layout, got, want), 0)
      << "gradient entries outside atol " << kGradAtol << " + rtol "
      << kGradRtol << " * |cpu|";
}

TEST_P(CudaParityTest, EvaluateMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const ParityCase& p = GetParam();
  const ModelLayout layout = ModelLayout::Mlp(p.dims);
  const std::vector<float> params = InitParams(layout, 7 + p.batch);
  // 2.5 chunks of max_batch = batch: full chunks and a partial one.
  const int n = p.batch * 2 + (p.batch + 1) / 2;
  const MlpBatch batch = DrawBatch(layout, params, n, 2000 + p.batch);
  auto cpu = MakeCpu(layout, p.batch);
  auto cuda = MakeCuda(layout, p.batch);
  ASSERT_TRUE(cpu && cuda);
  ASSERT_TRUE(cpu->SetWeights(params).ok());
  ASSERT_TRUE(cuda->SetWeights(params).ok());
  auto want = cpu->Evaluate(batch.x, batch.labels);
  auto got = cuda->Evaluate(batch.x, batch.labels);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->count, n);
  EXPECT_EQ(got->correct, want->correct);
  EXPECT_NEAR(got->loss_sum / n, want->loss_sum / n, kLossTol);
}

const std::vector<int> kSimpleNet = {784, 256, 128, 10};
const std::vector<int> kOddMlp = {37, 29, 13, 5};
const std::vector<int> kNoHidden = {6, 4};  // softmax regression
// More outputs than a warp's lanes, a hidden layer wider than a column-sum
// tile's multiple, and the job test's --layers.
const std::vector<int> kWideMlp = {50, 300, 40};
const std::vector<int> kJobTestMlp = {20, 64, 32, 3};

INSTANTIATE_TEST_SUITE_P(
    Batches, CudaParityTest,
    testing::Values(ParityCase{"SimpleNet", kSimpleNet, 1},
                    ParityCase{"SimpleNet", kSimpleNet, 63},
                    ParityCase{"SimpleNet", kSimpleNet, 64},
                    ParityCase{"SimpleNet", kSimpleNet, 1000},
                    ParityCase{"OddMlp", kOddMlp, 1},
                    ParityCase{"OddMlp", kOddMlp, 63},
                    ParityCase{"OddMlp", kOddMlp, 64},
                    ParityCase{"OddMlp", kOddMlp, 1000},
                    ParityCase{"NoHidden", kNoHidden, 63},
                    ParityCase{"WideMlp", kWideMlp, 200},
                    ParityCase{"JobTestMlp", kJobTestMlp, 16}),
    ParityName);

// ---------------------------------------------------------------------------
// Determinism.

std::vector<float> Gradient(Backend* backend, const ModelLayout& layout,
                            const MlpBatch& batch, float* loss) {
  std::vector<float> grad(layout.num_params());
  auto l =
      backend->ForwardBackward(batch.x, batch.labels, absl::MakeSpan(grad));
  EXPECT_TRUE(l.ok()) << l.status();
  *loss = l.ok() ? *l : NAN;
  return grad;
}

TEST(CudaBackendTest, SameBatchTwiceGivesBitwiseIdenticalGradients) {
  SKIP_WITHOUT_GPU();
  const ModelLayout layout = ModelLayout::SimpleNet();
  const std::vector<float> params = InitParams(layout, 3);
  auto cuda = MakeCuda(layout, 1000);
  ASSERT_TRUE(cuda);
  ASSERT_TRUE(cuda->SetWeights(params).ok());
  for (int B : {1000, 63}) {
    SCOPED_TRACE(absl::StrCat("B=", B));
    const MlpBatch a = DrawBatch(layout, params, B, 3000 + B);
    const MlpBatch other = DrawBatch(layout, params, 129, 4000 + B);
    // The first step of a size runs launch by launch, the second captures a
    // graph, the third replays it: all three must agree to the bit.
    float loss[3], unused;
    std::vector<float> g[3];
    for (int k = 0; k < 3; ++k) {
      g[k] = Gradient(cuda.get(), layout, a, &loss[k]);
      Gradient(cuda.get(), layout, other, &unused);  // state must not leak
    }
    for (int k = 1; k < 3; ++k) {
      EXPECT_EQ(std::memcmp(&loss[0], &loss[k], sizeof(float)), 0) << k;
      EXPECT_EQ(
          std::memcmp(g[0].data(), g[k].data(), g[0].size() * sizeof(float)), 0)
          << "step " << k;
    }
  }
}

TEST(CudaBackendTest, GraphsAndEagerLaunchesGiveBitwiseIdenticalGradients) {
  SKIP_WITHOUT_GPU();
  const ModelLayout layout = ModelLayout::SimpleNet();
  const std::vector<float> params = InitParams(layout, 4);
  auto graphs = MakeCuda(layout, 512, /*graphs=*/true);
  auto eager = MakeCuda(layout, 512, /*graphs=*/false);
  ASSERT_TRUE(graphs && eager);
  ASSERT_TRUE(graphs->SetWeights(params).ok());
  ASSERT_TRUE(eager->SetWeights(params).ok());
  for (int B : {512, 512, 100, 100, 512}) {  // eager, capture, replay
    SCOPED_TRACE(absl::StrCat("B=", B));
    const MlpBatch batch = DrawBatch(layout, params, B, 5000 + B);
    float loss_g, loss_e;
    const std::vector<float> g = Gradient(graphs.get(), layout, batch, &loss_g);
    const std::vector<float> e = Gradient(eager.get(), layout, batch, &loss_e);
    EXPECT_EQ(std::memcmp(&loss_g, &loss_e, sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(g.data(), e.data(), g.size() * sizeof(float)), 0);
  }
}

// The paths a training run takes besides one batch size replayed: an
// evaluation between replays (it writes the inputs and activations the
// graph reads), and more batch sizes than graphs are kept for (the eager
// path for the rest). Each step's gradient must be the eager backend's.
TEST(CudaBackendTest, EvaluationsAndManyBatchSizesBetweenReplaysChangeNothing) {
  SKIP_WITHOUT_GPU();
  const ModelLayout layout = ModelLayout::SimpleNet();
  const std::vector<float> params = InitParams(layout, 12);
  auto graphs = MakeCuda(layout, 256, /*graphs=*/true);
  auto eager = MakeCuda(layout, 256, /*graphs=*/false);
  ASSERT_TRUE(graphs && eager);
  ASSERT_TRUE(graphs->SetWeights(params).ok());
  ASSERT_TRUE(eager->SetWeights(params).ok());
  const MlpBatch eval = DrawBatch(layout, params, 200, 8800);
  // 12 sizes, each three times: more than the graphs kept (8).
  for (int round = 0; round < 3; ++round) {
    for (int B = 16; B <= 256; B += 20) {
      SCOPED_TRACE(absl::StrCat("round ", round, ", B=", B));
      const MlpBatch batch = DrawBatch(layout, params, B, 8000 + B);
      float loss_g, loss_e;
      const std::vector<float> g =
          Gradient(graphs.get(), layout, batch, &loss_g);
      const std::vector<float> e =
          Gradient(eager.get(), layout, batch, &loss_e);
      EXPECT_EQ(std::memcmp(&loss_g, &loss_e, sizeof(float)), 0);
      EXPECT_EQ(std::memcmp(g.data(), e.data(), g.size() * sizeof(float)), 0);
      auto evaluated = graphs->Evaluate(eval.x, eval.labels);
      ASSERT_TRUE(evaluated.ok()) << evaluated.status();
      EXPECT_EQ(evaluated->count, 200);
    }
  }
}

// A capture that fails (as a call that may not be captured makes it) costs
// no step: that step and the later ones launch one by one, with the same
// gradients as graphs would give, and no capture is tried again.
TEST(CudaBackendTest, AFailedGraphCaptureFallsBackToPlainLaunches) {
  SKIP_WITHOUT_GPU();
  const ModelLayout layout = ModelLayout::SimpleNet();
  const std::vector<float> params = InitParams(layout, 4);
  auto failing = MakeCuda(layout, 128, /*graphs=*/true, /*tf32=*/false,
                          /*fail_captures=*/true);
  auto eager = MakeCuda(layout, 128, /*graphs=*/false);
  ASSERT_TRUE(failing && eager);
  ASSERT_TRUE(failing->SetWeights(params).ok());
  ASSERT_TRUE(eager->SetWeights(params).ok());
  // Eager, then the capture (fails), then steps that would replay.
  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    const MlpBatch batch = DrawBatch(layout, params, 128, 5100 + step);
    std::vector<float> g(layout.num_params()), e(layout.num_params());
    auto loss_g =
        failing->ForwardBackward(batch.x, batch.labels, absl::MakeSpan(g));
    ASSERT_TRUE(loss_g.ok()) << loss_g.status();
    auto loss_e =
        eager->ForwardBackward(batch.x, batch.labels, absl::MakeSpan(e));
    ASSERT_TRUE(loss_e.ok()) << loss_e.status();
    EXPECT_EQ(*loss_g, *loss_e);
    EXPECT_EQ(std::memcmp(g.data(), e.data(), g.size() * sizeof(float)), 0);
  }
}

TEST(CudaBackendTest, NewWeightsAreUsedByTheNextStep) {
  SKIP_WITHOUT_GPU();
  const ModelLayout layout = ModelLayout::SimpleNet();
  const std::vector<float> p1 = InitParams(layout, 5);
  const std::vector<float> p2 = InitParams(layout, 6);
  const MlpBatch batch = DrawBatch(layout, p2, 64, 6000);
  auto cpu = MakeCpu(layout, 64);
  auto cuda = MakeCuda(layout, 64);
  ASSERT_TRUE(cpu && cuda);
  float unused;
  ASSERT_TRUE(cuda->SetWeights(p1).ok());
  Gradient(cuda.get(), layout, batch, &unused);
  // Two uploads in a row: the second must win.
  ASSERT_TRUE(cuda->SetWeights(p1).ok());
  ASSERT_TRUE(cuda->SetWeights(p2).ok());
  ASSERT_TRUE(cpu->SetWeights(p2).ok());
  float got_loss, want_loss;
  const std::vector<float> got = Gradient(cuda.get(), layout, batch, &got_loss);
  const std::vector<float> want =
      Gradient(cpu.get(), layout, batch, &want_loss);
  EXPECT_NEAR(got_loss, want_loss, kLossTol);
  EXPECT_EQ(CompareGradients(layout, got, want), 0);
}

TEST(CudaBackendTest, Tf32StaysCloseToFloat32) {
  SKIP_WITHOUT_GPU();
  const ModelLayout layout = ModelLayout::SimpleNet();
  const std::vector<float> params = InitParams(layout, 8);
  const MlpBatch batch = DrawBatch(layout, params, 512, 7000);
  auto fp32 = MakeCuda(layout, 512);
  auto tf32 = MakeCuda(layout, 512, /*graphs=*/true, /*tf32=*/true);
  ASSERT_TRUE(fp32 && tf32);
  // TF32 needs compute capability 8.0 (Ampere); below it (a T4, sm_75)
  // cuBLAS computes in float32 and the name does not claim TF32.
  auto gpu = OpenCudaDevice(0);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const bool has_tf32 = gpu->cc_major >= 8;
  EXPECT_EQ(tf32->Name().find("tf32") != std::string::npos, has_tf32)
      << tf32->Name();
  ASSERT_TRUE(fp32->SetWeights(params).ok());
  ASSERT_TRUE(tf32->SetWeights(params).ok());
  float loss32, loss_tf;
  const std::vector<float> g32 = Gradient(fp32.get(), layout, batch, &loss32);
  const std::vector<float> gtf = Gradient(tf32.get(), layout, batch, &loss_tf);
  EXPECT_NEAR(loss_tf, loss32, 1e-2);
  // TF32 keeps 10 mantissa bits: ~1e-3 relative per product.
  double diff = 0.0, ref = 0.0;
  for (size_t i = 0; i < g32.size(); ++i) {
    diff += (gtf[i] - g32[i]) * static_cast<double>(gtf[i] - g32[i]);
    ref += g32[i] * static_cast<double>(g32[i]);
  }
  std::printf("tf32 vs float32: gradient rel L2 %.3g\n", std::sqrt(diff / ref));
  EXPECT_LT(std::sqrt(diff / ref), 2e-2);
  if (!has_tf32) {
    EXPECT_EQ(diff, 0.0) << "no TF32 below compute capability 8.0";
    return;
  }
  // TF32 really ran: products of random float32 values rounded to 10
  // mantissa bits cannot all come out the same as exact float32 ones.
  EXPECT_GT(diff, 0.0)
      << "TF32 was asked for but the gradients are exactly "
         "float32's: cuBLAS ignored CUBLAS_TF32_TENSOR_OP_MATH";
}

// ---------------------------------------------------------------------------
// Validation, as CpuBackend.

TEST(CudaBackendTest, BadInputsAreRejectedLikeTheCpuBackend) {
  SKIP_WITHOUT_GPU();
  const ModelLayout layout = ModelLayout::SimpleNet();
  const int D = layout.input_dim();
  auto cuda = MakeCuda(layout, 8);
  ASSERT_TRUE(cuda);
  std::vector<float> grad(layout.num_params());
  std::vector<float> x(8 * D, 0.5f);
  std::vector<int32_t> labels(8, 1);
  auto code = [](const absl::Status& s) { return s.code(); };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  const auto kPrecondition = absl::StatusCode::kFailedPrecondition;

  EXPECT_EQ(
      code(cuda->ForwardBackward(x, labels, absl::MakeSpan(grad)).status()),
      kPrecondition);
  EXPECT_EQ(code(cuda->Evaluate(x, labels).status()), kPrecondition);
  EXPECT_EQ(code(cuda->ComputeUploaded()), kPrecondition);
  EXPECT_EQ(code(cuda->SetWeights(std::vector<float>(10))), kInvalid);
  ASSERT_TRUE(cuda->SetWeights(InitParams(layout, 1)).ok());

  std::vector<float> x9(9 * D);
  std::vector<int32_t> labels9(9, 0);
  EXPECT_EQ(
      code(cuda->ForwardBackward(x9, labels9, absl::MakeSpan(grad)).status()),
      kInvalid);  // over max_batch
  EXPECT_EQ(code(cuda->ForwardBackward({}, {}, absl::MakeSpan(grad)).status()),
            kInvalid);  // empty batch
  EXPECT_EQ(code(cuda->ForwardBackward(absl::MakeSpan(x).subspan(1), labels,
                                       absl::MakeSpan(grad))
                     .status()),
            kInvalid);  // x size
  EXPECT_EQ(
      code(cuda->ForwardBackward(x, labels, absl::MakeSpan(grad).subspan(1))
               .status()),
      kInvalid);  // grad size
  for (int32_t bad : {-1, 10}) {
    std::vector<int32_t> l = labels;
    l[3] = bad;
    EXPECT_EQ(code(cuda->ForwardBackward(x, l, absl::MakeSpan(grad)).status()),
              kInvalid);
    EXPECT_EQ(code(cuda->Evaluate(x, l).status()), kInvalid);
    EXPECT_EQ(code(cuda->UploadBatch(x, l)), kInvalid);
  }
  EXPECT_EQ(code(cuda->Evaluate(absl::MakeSpan(x).subspan(1), labels).status()),
            kInvalid);

  // Still works after the rejections; an empty evaluation is fine.
  EXPECT_TRUE(cuda->ForwardBackward(x, labels, absl::MakeSpan(grad)).ok());
  auto empty = cuda->Evaluate({}, {});
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->count, 0);
  EXPECT_TRUE(cuda->UploadBatch(x, labels).ok());
  EXPECT_TRUE(cuda->ComputeUploaded().ok());
}

// ---------------------------------------------------------------------------
// The module, as dp-worker loads it.

// The module this build made, or DP_CUDA_MODULE's (as dp-worker's
// --cuda_module) where the test runs from elsewhere.
BackendRequest ModuleRequest(const std::string& name) {
  BackendRequest request;
  request.name = name;
  const char* from_env = std::getenv("DP_CUDA_MODULE");
  request.cuda_module = from_env != nullptr ? from_env : DP_CUDA_MODULE_FILE;
  return request;
}

TEST(CudaModuleTest, ModuleLoadsAndAgreesWithTheDirectBackend) {
  std::string why;
  const bool usable = GpuUsable(&why);
  auto cuda = BackendChoice::Resolve(ModuleRequest("cuda"));
  auto any = BackendChoice::Resolve(ModuleRequest("auto"));
  ASSERT_TRUE(any.ok()) << any.status();
  if (!usable) {
    std::printf("no usable GPU: %s\n", why.c_str());
    ASSERT_FALSE(cuda.ok());
    EXPECT_EQ(cuda.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(cuda.status().message().find(why), std::string::npos)
        << cuda.status();
    EXPECT_FALSE(any->cuda());
    EXPECT_FALSE(any->why().empty());
    EXPECT_EQ(any->Describe(), absl::StrCat("cpu (auto: ", any->why(), ")"));
    return;
  }
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  ASSERT_TRUE(cuda->cuda() && any->cuda());
  std::printf("%s\n", cuda->Describe().c_str());
  EXPECT_EQ(cuda->gpu().device, 0);  // rank 0, device -1
  EXPECT_GT(cuda->gpu().memory_bytes, 0);
  EXPECT_GE(cuda->gpu().cc_major * 10 + cuda->gpu().cc_minor, 75);
  EXPECT_NE(cuda->Describe().find(cuda->gpu().name), std::string::npos);

  // The module's backend and the one linked here are the same code.
  const ModelLayout layout = ModelLayout::SimpleNet();
  BackendOptions options;
  options.max_batch = 64;
  auto from_module = cuda->Create(layout, options);
  ASSERT_TRUE(from_module.ok()) << from_module.status();
  auto direct = CudaBackend::Create(layout, options);
  ASSERT_TRUE(direct.ok()) << direct.status();
  const std::vector<float> params = InitParams(layout, 3);
  const MlpBatch batch = DrawBatch(layout, params, 64, 9100);
  ASSERT_TRUE((*from_module)->SetWeights(params).ok());
  ASSERT_TRUE((*direct)->SetWeights(params).ok());
  float loss_module, loss_direct;
  const std::vector<float> g1 =
      Gradient(from_module->get(), layout, batch, &loss_module);
  const std::vector<float> g2 =
      Gradient(direct->get(), layout, batch, &loss_direct);
  EXPECT_EQ(std::memcmp(g1.data(), g2.data(), g1.size() * sizeof(float)), 0);
  EXPECT_EQ(loss_module, loss_direct);
}

TEST(CudaModuleTest, DevicesAreChosenByRankAndCheckedForRange) {
  SKIP_WITHOUT_GPU();
  const int count = *CudaDeviceCount();
  BackendRequest request = ModuleRequest("cuda");
  request.rank = count + 1;  // device -1: rank modulo the visible devices
  auto by_rank = BackendChoice::Resolve(request);
  ASSERT_TRUE(by_rank.ok()) << by_rank.status();
  EXPECT_EQ(by_rank->gpu().device, (count + 1) % count);
  EXPECT_EQ(by_rank->gpu().device_count, count);
  request.device = count;  // one past the last
  auto missing = BackendChoice::Resolve(request);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(missing.status().message().find("does not exist"),
            std::string::npos)
      << missing.status();
}

TEST(CudaModuleTest, AMissingModuleIsNamed) {
  BackendRequest request;
  request.name = "cuda";
  request.cuda_module = "/nonexistent/libdp_cuda.so";
  auto cuda = BackendChoice::Resolve(request);
  ASSERT_FALSE(cuda.ok());
  EXPECT_EQ(cuda.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(cuda.status().message().find(request.cuda_module),
            std::string::npos)
      << cuda.status();
  request.name = "auto";
  auto any = BackendChoice::Resolve(request);
  ASSERT_TRUE(any.ok()) << any.status();
  EXPECT_FALSE(any->cuda());
  // Without a driver, auto says so before it looks for the module.
  EXPECT_NE(any->why().find(CudaDriverPresent().ok() ? request.cuda_module
                                                     : "no CUDA driver"),
            std::string::npos)
      << any->why();
}

// Every entry of the build's CMAKE_CUDA_ARCHITECTURES (DP_CUDA_ARCHITECTURES,
// e.g. "75-real;...;120-virtual", or "90" from -DCMAKE_CUDA_ARCHITECTURES=90)
// is named: code ("sm_N") unless virtual, PTX ("compute_N") unless real.
TEST(CudaModuleTest, TheBuildNamesEveryArchitecture) {
  const std::string named = CudaArchitectures();
  std::set<std::string> words;
  for (absl::string_view w :
       absl::StrSplit(named, absl::ByAnyChar(" ,"), absl::SkipEmpty())) {
    words.emplace(w);
  }
  int entries = 0;
  for (absl::string_view arch :
       absl::StrSplit(DP_CUDA_ARCHITECTURES, ';', absl::SkipEmpty())) {
    ++entries;
    const size_t dash = arch.find('-');
    const std::string number(arch.substr(0, dash));
    const absl::string_view kind =
        dash == absl::string_view::npos ? "" : arch.substr(dash + 1);
    if (kind != "virtual") {
      EXPECT_EQ(words.count("sm_" + number), 1u) << arch << ": " << named;
    }
    if (kind != "real") {
      EXPECT_EQ(words.count("compute_" + number), 1u) << arch << ": " << named;
    }
  }
  EXPECT_GT(entries, 0) << DP_CUDA_ARCHITECTURES;
}

#endif  // DP_HAVE_CUDA

}  // namespace
}  // namespace dp
