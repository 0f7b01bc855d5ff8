// Adam against values worked out independently of server/adam.cc.
#include "server/adam.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/parallel_for.h"
#include "common/tensor_codec.h"
#include "gtest/gtest.h"
#include "tests/same_state.h"

namespace dp {
namespace {

// The job length the update is told: only a cosine schedule reads it.
constexpr int64_t kTotalSteps = 1000;

// With a constant gradient g, Adam's bias-corrected moments are exactly g and
// g^2 at every step, so each step moves p by -lr * g / (|g| + eps).
TEST(AdamTest, ConstantGradientMovesByLrPerStepInClosedForm) {
  const std::vector<float> g = {0.5f, -0.25f, 2.0f, -1e-3f, 0.0f};
  const std::vector<float> p0 = {0.1f, -0.2f, 0.3f, 0.0f, 0.05f};
  std::vector<float> p = p0, m(g.size(), 0.0f), v(g.size(), 0.0f);
  AdamOptions o;
  const float* grads[] = {g.data()};
  for (int t = 1; t <= 3; ++t) {
    AverageAndAdamStep(o, t, kTotalSteps, grads, g.size(), p.data(), m.data(),
                       v.data());
  }
  for (size_t i = 0; i < g.size(); ++i) {
    const double expected = p0[i] - 3 * o.lr * g[i] / (std::fabs(g[i]) + o.eps);
    EXPECT_NEAR(p[i], expected, 1e-7) << "element " << i;
  }
}

// Element i of step t's values, as tests/golden/make_adam_golden.py makes
// them: float32 bit patterns from an integer hash, exponents
// [min_exp, min_exp + exp_range), random signs, one in 64 exactly zero.
float GoldenValue(uint64_t t, uint64_t i, uint64_t min_exp,
                  uint64_t exp_range) {
  uint64_t x = t * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull + 1;
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  uint32_t bits = static_cast<uint32_t>(
      ((x >> 40) & 1) << 31 | (min_exp + (x >> 23) % exp_range) << 23 |
      (x & 0x7FFFFF));
  if (((x >> 48) & 63) == 0) bits = 0;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// torch.optim.Adam (PyTorch 1.13.1, its AVX2 CPU kernels) ran 160 steps of
// GoldenValue gradients on 2048 parameters and saved parameters, exp_avg and
// exp_avg_sq (tests/golden/make_adam_golden.py). The same steps here must
// give the same bits: every rounding of PyTorch's sequence is reproduced -
// including the fused multiply-add of exp_avg.add_(grad, alpha) - so a
// difference of even one ulp would grow over 160 steps.
// The length is a multiple of 64 because PyTorch's kernels handle the last
// (length mod 16) elements of a tensor in a scalar loop, where GCC contracts
// v + (1-b2)*g*g into an FMA that its vector loop does not use: there,
// and only there, torch itself rounds v differently (by up to 1 ulp).
// Runs `steps` updates of GoldenValue gradients (scaled as the script
// scales them for a clipped run) on 2048 parameters and compares params,
// m and v with what torch saved in tests/golden/`file`, bit for bit.
void ExpectTorchBits(const std::string& file, const AdamOptions& o, int steps) {
  constexpr int64_t kN = 2048;
  std::ifstream in(std::string(DP_GOLDEN_DIR) + "/" + file, std::ios::binary);
  ASSERT_TRUE(in.good()) << "cannot open " << DP_GOLDEN_DIR << "/" << file;
  const std::string bytes((std::istreambuf_iterator<char>(in)),
                          std::istreambuf_iterator<char>());
  ASSERT_EQ(bytes.size(), 3 * kN * sizeof(float)) << file;
  std::vector<float> want(3 * kN);
  std::memcpy(want.data(), bytes.data(), bytes.size());

  std::vector<float> p(kN), m(kN, 0.0f), v(kN, 0.0f), g(kN);
  for (int64_t i = 0; i < kN; ++i) p[i] = GoldenValue(0, i, 117, 10);
  const float* grads[] = {g.data()};
  for (int t = 1; t <= steps; ++t) {
    // Powers of two, so the scaled gradients are exact: some steps clip,
    // some do not.
    const float scale =
        o.clip_grad_norm > 0 ? std::ldexp(1.0f, -8 * (t % 3)) : 1.0f;
    for (int64_t i = 0; i < kN; ++i) g[i] = GoldenValue(t, i, 97, 42) * scale;
    AverageAndAdamStep(o, t, steps, grads, kN, p.data(), m.data(), v.data());
  }
  const char* names[] = {"param", "exp_avg", "exp_avg_sq"};
  const std::vector<float>* got[] = {&p, &m, &v};
  for (int k = 0; k < 3; ++k) {
    int mismatches = 0;
    for (int64_t i = 0; i < kN; ++i) {
      const float w = want[k * kN + i];
      const float h = (*got[k])[i];
      if (std::memcmp(&w, &h, 4) == 0) continue;
      if (++mismatches <= 5) {
        ADD_FAILURE() << file << " " << names[k] << "[" << i << "]: torch "
                      << std::hexfloat << w << ", here " << h;
      }
    }
    EXPECT_EQ(mismatches, 0)
        << file << ": " << names[k] << " elements differ of " << kN;
  }
}

// torch.optim.Adam (PyTorch 1.13.1, its AVX2 CPU kernels) ran 160 steps of
// GoldenValue gradients on 2048 parameters and saved parameters, exp_avg and
// exp_avg_sq (tests/golden/make_adam_golden.py). The same steps here must
// give the same bits: every rounding of PyTorch's sequence is reproduced -
// including the fused multiply-add of exp_avg.add_(grad, alpha) - so a
// difference of even one ulp would grow over 160 steps.
// The length is a multiple of 64 because PyTorch's kernels handle the last
// (length mod 16) elements of a tensor in a scalar loop, where GCC contracts
// v + (1-b2)*g*g into an FMA that its vector loop does not use: there,
// and only there, torch itself rounds v differently (by up to 1 ulp).
TEST(AdamTest, HundredsOfStepsMatchPyTorchAdamBitForBit) {
  // torch's defaults: lr 1e-3, betas 0.9/0.999, eps 1e-8
  ExpectTorchBits("adam_golden.f32", AdamOptions(), 160);
}

// The runs of make_adam_golden.py's RUNS, with the same settings.
TEST(AdamTest, AdamWithL2WeightDecayMatchesPyTorchBitForBit) {
  AdamOptions o;
  o.lr = 2e-3;
  o.weight_decay = 0.01;
  ExpectTorchBits("adam_l2_golden.f32", o, 160);
}

TEST(AdamTest, AdamWMatchesPyTorchBitForBit) {
  AdamOptions o;
  o.decoupled_weight_decay = true;
  o.weight_decay = 0.1;
  o.beta1 = 0.8;
  o.beta2 = 0.99;
  o.eps = 1e-6;
  ExpectTorchBits("adamw_golden.f32", o, 160);
}

// Warm-up and cosine decay over the job's 40 steps, clipped gradients.
TEST(AdamTest, CosineScheduleWithClippingMatchesPyTorchBitForBit) {
  AdamOptions o;
  o.lr = 1e-2;
  o.decoupled_weight_decay = true;
  o.weight_decay = 0.05;
  o.beta1 = 0.85;
  o.beta2 = 0.98;
  o.eps = 1e-7;
  o.schedule.kind = LrScheduleKind::kCosine;
  o.schedule.warmup_steps = 5;
  o.schedule.lr_min = 1e-4;
  o.clip_grad_norm = 1.0;
  ExpectTorchBits("cosine_clip_golden.f32", o, 40);
}

TEST(AdamTest, StepScheduleWithClippingMatchesPyTorchBitForBit) {
  AdamOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.01;
  o.schedule.kind = LrScheduleKind::kStep;
  o.schedule.warmup_steps = 3;
  o.schedule.step_every = 7;
  o.schedule.gamma = 0.5;
  o.clip_grad_norm = 1.0;
  ExpectTorchBits("step_clip_golden.f32", o, 40);
}

// Textbook Adam (Kingma & Ba, with torch's eps placement) in double.
struct ReferenceAdam {
  std::vector<double> p, m, v;
  void Step(const AdamOptions& o, int t, const std::vector<double>& g) {
    for (size_t i = 0; i < p.size(); ++i) {
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g[i];
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g[i] * g[i];
      const double mhat = m[i] / (1 - std::pow(o.beta1, t));
      const double denom =
          std::sqrt(v[i]) / std::sqrt(1 - std::pow(o.beta2, t)) + o.eps;
      p[i] -= o.lr * mhat / denom;
    }
  }
};

TEST(AdamTest, ThreeStepsOfAveragedGradientsMatchDoubleReference) {
  // Integer-valued gradients: their averages are exact in float.
  const std::vector<std::vector<float>> steps_rank0 = {
      {1, -2, 3, 0}, {4, 4, -1, 2}, {-3, 1, 1, -5}};
  const std::vector<std::vector<float>> steps_rank1 = {
      {3, 2, -1, 2}, {-2, 0, 5, 2}, {1, 1, -3, 1}};
  std::vector<float> p = {0.5f, -0.5f, 0.25f, 0.0f};
  std::vector<float> m(4, 0.0f), v(4, 0.0f);
  ReferenceAdam ref{{0.5, -0.5, 0.25, 0.0}, {0, 0, 0, 0}, {0, 0, 0, 0}};
  AdamOptions o;
  o.lr = 0.01;
  for (int t = 1; t <= 3; ++t) {
    const float* grads[] = {steps_rank0[t - 1].data(),
                            steps_rank1[t - 1].data()};
    AverageAndAdamStep(o, t, kTotalSteps, grads, 4, p.data(), m.data(),
                       v.data());
    std::vector<double> avg(4);
    for (int i = 0; i < 4; ++i) {
      avg[i] = (steps_rank0[t - 1][i] + steps_rank1[t - 1][i]) / 2.0;
    }
    ref.Step(o, t, avg);
    for (int i = 0; i < 4; ++i) {
      EXPECT_NEAR(p[i], ref.p[i], 1e-7) << "step " << t << " element " << i;
      EXPECT_NEAR(m[i], ref.m[i], 1e-6) << "step " << t << " element " << i;
      EXPECT_NEAR(v[i], ref.v[i], 1e-6) << "step " << t << " element " << i;
    }
  }
}

// A gradient of norm 5 clipped to 1 is scaled by 1 / (5 + 1e-6), in
// float; one of norm 5 under a limit of 10 is left as it is. With beta1 = 0,
// m is the gradient the update used, exactly.
TEST(AdamTest, ClippingScalesTheAverageByTheLimitOverItsGlobalNorm) {
  const std::vector<float> g0 = {6, 0, -8}, g1 = {0, 0, 0};  // average 3,0,-4
  const float* grads[] = {g0.data(), g1.data()};
  for (double limit : {1.0, 10.0}) {
    std::vector<float> p(3, 0.0f), m(3, 0.0f), v(3, 0.0f);
    AdamOptions o;
    o.beta1 = 0.0;
    o.clip_grad_norm = limit;
    AverageAndAdamStep(o, 1, kTotalSteps, grads, 3, p.data(), m.data(),
                       v.data());
    const float coef =
        limit < 5 ? (1.0f / (5.0f + static_cast<float>(1e-6))) * 1.0f : 1.0f;
    EXPECT_EQ(m[0], 3.0f * coef) << "limit " << limit;
    EXPECT_EQ(m[1], 0.0f) << "limit " << limit;
    EXPECT_EQ(m[2], -4.0f * coef) << "limit " << limit;
    if (limit < 5) EXPECT_NEAR(std::hypot(m[0], m[2]), 1.0, 1e-6);
  }
}

// AdamW shrinks the weights by lr * wd before the update, and the gradient
// (here 0, so m and v stay 0 and the update adds 0) is not touched.
TEST(AdamTest, AdamWDecaysTheWeightsApartFromTheGradient) {
  std::vector<float> p = {1.0f, -2.0f}, m = {0.0f, 0.0f}, v = {0.0f, 0.0f};
  const std::vector<float> g = {0.0f, 0.0f};
  AdamOptions o;
  o.decoupled_weight_decay = true;
  o.weight_decay = 0.5;
  o.lr = 0.1;
  const float* grads[] = {g.data()};
  AverageAndAdamStep(o, 1, kTotalSteps, grads, 2, p.data(), m.data(), v.data());
  const auto decay = static_cast<float>(1.0 - 0.1 * 0.5);
  EXPECT_EQ(p[0], 1.0f * decay);
  EXPECT_EQ(p[1], -2.0f * decay);
  EXPECT_EQ(m[0], 0.0f);
  EXPECT_EQ(v[1], 0.0f);
}

TEST(AdamTest, WeightDecayAddsDecayTimesParamToTheGradient) {
  std::vector<float> p = {1.0f}, m = {0.0f}, v = {0.0f};
  const std::vector<float> g = {0.0f};
  AdamOptions o;
  o.weight_decay = 0.5;
  const float* grads[] = {g.data()};
  AverageAndAdamStep(o, 1, kTotalSteps, grads, 1, p.data(), m.data(), v.data());
  // Effective gradient 0.5 > 0: the first step moves by -lr.
  EXPECT_NEAR(p[0], 1.0 - o.lr, 1e-7);
}

struct AdamState {
  std::vector<float> p, m, v;
};

// Random state and three steps of gradients: magnitudes from 1e-12 to 1e3,
// zeros of both signs, subnormals.
struct RandomRun {
  AdamState start;
  std::vector<std::vector<std::vector<float>>> grads;  // [step][rank][i]
};

RandomRun MakeRandomRun(int ranks, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-40, 10);
  std::uniform_int_distribution<int> kind(0, 19);
  auto draw = [&] {
    switch (kind(rng)) {
      case 0:
        return 0.0f;
      case 1:
        return -0.0f;
      case 2:
        return mantissa(rng) * 1e-39f;  // subnormal
      default:
        return std::ldexp(mantissa(rng), exponent(rng));
    }
  };
  RandomRun run;
  run.start = {std::vector<float>(n), std::vector<float>(n),
               std::vector<float>(n)};
  for (int64_t i = 0; i < n; ++i) {
    run.start.p[i] = draw();
    run.start.m[i] = draw();
    run.start.v[i] = std::fabs(draw());
  }
  run.grads.assign(
      3, std::vector<std::vector<float>>(ranks, std::vector<float>(n)));
  for (auto& step : run.grads) {
    for (auto& g : step) {
      for (float& x : g) x = draw();
    }
  }
  return run;
}

// AdamW with warm-up, cosine decay and clipping at 1, which every gradient
// of these tests exceeds.
AdamOptions ClippedAdamW() {
  AdamOptions o;
  o.decoupled_weight_decay = true;
  o.weight_decay = 0.1;
  o.schedule.kind = LrScheduleKind::kCosine;
  o.schedule.warmup_steps = 2;
  o.clip_grad_norm = 1.0;
  return o;
}

AdamState Apply(const RandomRun& run, const AdamOptions& o, WorkerPool* pool) {
  AdamState s = run.start;
  for (size_t step = 0; step < run.grads.size(); ++step) {
    std::vector<const float*> grads;
    for (const auto& g : run.grads[step]) grads.push_back(g.data());
    AverageAndAdamStep(o, step + 1, kTotalSteps, grads, s.p.size(), s.p.data(),
                       s.m.data(), s.v.data(), pool);
  }
  return s;
}

// Each element's arithmetic does not depend on which thread runs it, and
// the clipping norm is one sum in element order, so the pool changes no
// bit - including for a non-power-of-two rank count (true division) and a
// length that is not a multiple of the block.
TEST(AdamTest, PoolsOfAnySizeGiveTheSameBitsAsNoPool) {
  AdamOptions l2;
  l2.weight_decay = 0.01;
  const AdamOptions options[] = {AdamOptions(), l2, ClippedAdamW()};
  for (int64_t n : {int64_t{235146}, int64_t{1500}, int64_t{7}}) {
    for (int ranks : {1, 2, 3}) {
      const RandomRun run = MakeRandomRun(ranks, n, ranks);
      for (int k = 0; k < 3; ++k) {
        const AdamState expected = Apply(run, options[k], nullptr);
        for (int threads : {1, 2, 3, 4}) {
          SCOPED_TRACE(testing::Message()
                       << "n " << n << " ranks " << ranks << " options " << k
                       << " threads " << threads);
          WorkerPool pool(threads);
          const AdamState got = Apply(run, options[k], &pool);
          EXPECT_TRUE(SameBits(got.p, expected.p));
          EXPECT_TRUE(SameBits(got.m, expected.m));
          EXPECT_TRUE(SameBits(got.v, expected.v));
        }
      }
    }
  }
}

// The average is the float sum divided by N, bit for bit: for N = 2^k the
// update multiplies by 1/N instead, which must round the same, subnormal
// results included; for other N it must not (0.1 * 3 * (1/3) is not 0.1).
TEST(AdamTest, AverageIsTheRankSumDividedByTheCountExactly) {
  const std::vector<float> g0 = {1.0f,  3.0f,   0.1f,    0.7f,   7.0f,
                                 11.0f, 1e-45f, -3e-45f, 7e-39f, 1e30f};
  for (int ranks : {2, 3, 4, 5, 6, 7, 8, 9}) {
    std::vector<const float*> grads(ranks, g0.data());
    const size_t n = g0.size();
    std::vector<float> p(n, 0.0f), m(n, 0.0f), v(n, 0.0f);
    AdamOptions o;
    o.beta1 = 0.0;  // m = g exactly
    AverageAndAdamStep(o, 1, kTotalSteps, grads, n, p.data(), m.data(),
                       v.data());
    for (size_t i = 0; i < n; ++i) {
      float sum = g0[i];
      for (int r = 1; r < ranks; ++r) sum += g0[i];
      const float expected = sum / static_cast<float>(ranks);
      EXPECT_EQ(std::memcmp(&m[i], &expected, sizeof(float)), 0)
          << "ranks " << ranks << " element " << i << ": " << m[i] << " vs "
          << expected;
    }
  }
}

// Float addition is not associative: the sum must be ((g0 + g1) + g2) + ...
// exactly, whatever the number of ranks.
TEST(AdamTest, GradientsAreAddedInRankOrder) {
  const int64_t n = 1100;  // two full blocks and a partial one
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-24, 24);
  for (int ranks = 1; ranks <= 10; ++ranks) {
    std::vector<std::vector<float>> g(ranks, std::vector<float>(n));
    std::vector<const float*> grads;
    for (auto& rank : g) {
      for (float& x : rank) x = std::ldexp(mantissa(rng), exponent(rng));
      grads.push_back(rank.data());
    }
    std::vector<float> p(n, 0.0f), m(n, 0.0f), v(n, 0.0f);
    AdamOptions o;
    o.beta1 = 0.0;  // m = g exactly
    AverageAndAdamStep(o, 1, kTotalSteps, grads, n, p.data(), m.data(),
                       v.data());
    for (int64_t i = 0; i < n; ++i) {
      float sum = g[0][i];
      for (int r = 1; r < ranks; ++r) sum += g[r][i];
      ASSERT_EQ(m[i], sum / static_cast<float>(ranks))
          << "ranks " << ranks << " element " << i;
    }
  }
}

// Random floats of every magnitude from 2^-20 to 2^20, both signs.
std::vector<float> RandomFloats(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<float> x(n);
  for (float& f : x) f = std::ldexp(mantissa(rng), exponent(rng));
  return x;
}

std::string Encoded(Encoding e, const std::vector<float>& x) {
  std::string bytes(x.size() * BytesPerValue(e), '\0');
  Encode(e, x.data(), x.size(), bytes.data());
  return bytes;
}

// sum[i] += x[i]: the float additions the rank sum is made of, one rank
// at a time.
void AddInto(std::vector<float>* sum, const std::vector<float>& x) {
  for (size_t i = 0; i < x.size(); ++i) (*sum)[i] += x[i];
}

// dp-ps folds each gradient into the rank sum as it reads it
// (AddEncodedToSum, rank order) and applies Adam to the sum
// (AdamStepOnSum): the same bits as
// AverageAndAdamStep over the gradients, params, m and v alike, for every
// number of ranks (powers of two divide by multiplying), with a pool or not.
TEST(AdamTest, FoldingGradientsAsTheyArriveGivesTheSameBits) {
  const int64_t n = 3000;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  WorkerPool pool(3);
  for (int ranks = 1; ranks <= 9; ++ranks) {
    std::vector<std::vector<float>> g(ranks, std::vector<float>(n));
    std::vector<const float*> grads;
    for (auto& rank : g) {
      for (float& x : rank) x = std::ldexp(mantissa(rng), exponent(rng));
      grads.push_back(rank.data());
    }
    std::vector<float> p0(n), m0(n), v0(n);
    for (int64_t i = 0; i < n; ++i) {
      p0[i] = mantissa(rng);
      m0[i] = 0.01f * mantissa(rng);
      v0[i] = 0.001f * std::fabs(mantissa(rng));
    }
    for (const AdamOptions& o : {AdamOptions(), ClippedAdamW()}) {
      auto p = p0, m = m0, v = v0;
      AverageAndAdamStep(o, 3, kTotalSteps, grads, n, p.data(), m.data(),
                         v.data());
      for (WorkerPool* with : {static_cast<WorkerPool*>(nullptr), &pool}) {
        std::vector<float> sum(n), next(n);
        for (int r = 0; r < ranks; ++r) {
          const std::string bytes = Encoded(Encoding::kF32, g[r]);
          ASSERT_EQ(AddEncodedToSum(Encoding::kF32, bytes.data(), n, 1e15f,
                                    r == 0 ? nullptr : sum.data(), {},
                                    next.data(), with),
                    -1);
          std::swap(sum, next);
        }
        auto fp = p0, fm = m0, fv = v0;
        AdamStepOnSum(o, 3, kTotalSteps, sum.data(), ranks, n, fp.data(),
                      fm.data(), fv.data(), with);
        EXPECT_EQ(std::memcmp(fp.data(), p.data(), n * 4), 0)
            << ranks << " ranks";
        EXPECT_EQ(std::memcmp(fm.data(), m.data(), n * 4), 0)
            << ranks << " ranks";
        EXPECT_EQ(std::memcmp(fv.data(), v.data(), n * 4), 0)
            << ranks << " ranks";
      }
    }
  }
}

// The copy an update writes as it goes (the workers' weights in shared
// memory) is the encoding of the params it leaves, every value of them, in
// either encoding and with a pool or not, and the update is the same bits
// as without it. 3000 values end within a block.
TEST(AdamTest, TheCopyWrittenInTheUpdatesPassIsTheEncodedParams) {
  const int64_t n = 3000;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> sum(n), p0(n), m0(n), v0(n);
  for (int64_t i = 0; i < n; ++i) {
    sum[i] = 0.1f * uniform(rng);
    p0[i] = uniform(rng);
    m0[i] = 0.01f * uniform(rng);
    v0[i] = 0.001f * std::fabs(uniform(rng));
  }
  auto p = p0, m = m0, v = v0;
  AdamStepOnSum(AdamOptions(), 3, kTotalSteps, sum.data(), 2, n, p.data(),
                m.data(), v.data());
  WorkerPool pool(3);
  for (Encoding e : {Encoding::kF32, Encoding::kBf16}) {
    for (WorkerPool* with : {static_cast<WorkerPool*>(nullptr), &pool}) {
      // One byte more than the copy, which must stay as it was.
      std::string copy(n * BytesPerValue(e) + 1, '\x5a');
      auto cp = p0, cm = m0, cv = v0;
      AdamStepOnSum(AdamOptions(), 3, kTotalSteps, sum.data(), 2, n, cp.data(),
                    cm.data(), cv.data(), with, EncodedCopy{copy.data(), e});
      EXPECT_EQ(std::memcmp(cp.data(), p.data(), n * 4), 0);
      EXPECT_EQ(std::memcmp(cm.data(), m.data(), n * 4), 0);
      EXPECT_EQ(std::memcmp(cv.data(), v.data(), n * 4), 0);
      const std::string expected = Encoded(e, p);
      EXPECT_EQ(copy.substr(0, expected.size()), expected)
          << EncodingName(e) << (with != nullptr ? ", pool" : "");
      EXPECT_EQ(copy.back(), '\x5a');
    }
  }
}

// dp-ps adds the gradient of the next rank to fold to the rank sum as it
// reads it from the wire bytes, with the gradients of the ranks after it
// that came early: the sum must be the bits of decoding it and then adding
// each in rank order - with no sum (rank 0) or one, none to
// four kept gradients, both encodings, any pool and lengths that end within
// a block; what it is given stays as it was.
TEST(AdamTest, AddingAnEncodedGradientGivesTheBitsOfDecodingThenAdding) {
  WorkerPool pool3(3), pool4(4);
  for (Encoding e : {Encoding::kF32, Encoding::kBf16}) {
    for (int64_t n : {int64_t{235146}, int64_t{1500}, int64_t{7}}) {
      const std::vector<float> sum = RandomFloats(n, 11);
      const std::string bytes = Encoded(e, RandomFloats(n, 12));
      std::vector<std::vector<float>> kept;
      for (uint32_t k = 0; k < 4; ++k) kept.push_back(RandomFloats(n, 13 + k));
      std::vector<float> g(n);
      ASSERT_EQ(DecodeChecked(e, bytes.data(), n, 1e15f, g.data()), -1);
      for (bool with_sum : {false, true}) {
        for (size_t count : {0, 1, 4}) {
          std::vector<float> expected = g;
          if (with_sum) {
            expected = sum;
            AddInto(&expected, g);
          }
          std::vector<const float*> kept_now;
          for (size_t k = 0; k < count; ++k) {
            AddInto(&expected, kept[k]);
            kept_now.push_back(kept[k].data());
          }
          for (WorkerPool* pool :
               {static_cast<WorkerPool*>(nullptr), &pool3, &pool4}) {
            SCOPED_TRACE(testing::Message()
                         << EncodingName(e) << " n " << n
                         << (with_sum ? " sum" : " no sum") << " kept " << count
                         << " threads " << (pool ? pool->threads() : 0));
            std::vector<float> out(n, -1.0f);
            const std::vector<float> given = sum;
            EXPECT_EQ(AddEncodedToSum(e, bytes.data(), n, 1e15f,
                                      with_sum ? given.data() : nullptr,
                                      kept_now, out.data(), pool),
                      -1);
            EXPECT_TRUE(SameBits(out, expected));
            EXPECT_TRUE(SameBits(given, sum));
          }
        }
      }
    }
  }
}

// A value out of range anywhere - in any block, at either end of a block,
// in any thread's share - is found, the first one when there are two, and
// reported as it was read.
TEST(AdamTest, AnEncodedGradientsFirstBadValueIsFoundWhereverItIs) {
  const int64_t n = 1100;  // two full blocks and a partial one
  const float limit = 1e15f;
  const float bad_values[] = {std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(),
                              -2 * limit};
  WorkerPool pool(3);
  const std::vector<float> sum = RandomFloats(n, 21);
  const std::vector<float> kept = RandomFloats(n, 24);
  const float* const one_kept[] = {kept.data()};
  for (Encoding e : {Encoding::kF32, Encoding::kBf16}) {
    for (WorkerPool* with : {static_cast<WorkerPool*>(nullptr), &pool}) {
      for (float bad : bad_values) {
        for (int64_t at = 0; at < n; ++at) {
          std::vector<float> g = RandomFloats(n, 22);
          g[at] = bad;
          // A second bad value after it, in a later block.
          if (at + 600 < n) g[at + 600] = std::numeric_limits<float>::max();
          const std::string bytes = Encoded(e, g);
          std::vector<float> out(n);
          // Rank 0 with a rank kept, or a later rank with none.
          const bool first = at % 2 == 0;
          const int64_t found = AddEncodedToSum(
              e, bytes.data(), n, limit, first ? nullptr : sum.data(),
              first ? absl::Span<const float* const>(one_kept)
                    : absl::Span<const float* const>(),
              out.data(), with);
          ASSERT_EQ(found, at) << EncodingName(e) << " " << bad << " at " << at
                               << (with ? " with a pool" : "");
          // As it was read: in bf16, rounded.
          const std::string sent = Encoded(e, {bad});
          float expected;
          Decode(e, sent.data(), 1, &expected);
          if (std::isnan(bad)) {
            EXPECT_TRUE(std::isnan(out[at]));
          } else {
            EXPECT_EQ(out[at], expected);
          }
        }
      }
    }
  }
  std::vector<float> g = RandomFloats(n, 23);
  g[n - 1] = -limit;
  std::vector<float> out(n);
  EXPECT_EQ(AddEncodedToSum(Encoding::kF32, Encoded(Encoding::kF32, g).data(),
                            n, limit, sum.data(), {}, out.data(), &pool),
            -1)
      << "the limit itself is accepted";
}

}  // namespace
}  // namespace dp
