// Rank-ordered gradient averaging fused with the Adam update.
#include "server/adam.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>

#include "common/status_macros.h"
#include "server/lr_schedule.h"

namespace dp {
namespace {

// Elements per block: the summed gradient of a block stays in L1 between
// the averaging pass and the update pass, so each buffer is streamed once.
constexpr int64_t kBlock = 512;

struct Coefficients {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, wd, eps, neg_step_size,
      bc2_sqrt, count, inv_count;
  // The averaged gradient's clipping factor and AdamW's decay of the
  // weights: 1 when off, and x * 1 is x exactly, so the default update's
  // bits do not move.
  float clip, decay;
};

// g[0, n) = the sum of ranks [first, first + kRanks) at offset b, added in
// rank order to g (kStart: to nothing - the sum starts here).
template <int kRanks, bool kStart>
__attribute__((always_inline)) inline void AddRanks(float* __restrict g,
                                                    const float* const* grads,
                                                    size_t first, int64_t b,
                                                    int64_t n) {
  static_assert(kRanks >= 1 && kRanks <= 4, "one to four ranks a pass");
  const float* __restrict x0 = grads[first] + b;
  const float* __restrict x1 = kRanks > 1 ? grads[first + 1] + b : nullptr;
  const float* __restrict x2 = kRanks > 2 ? grads[first + 2] + b : nullptr;
  const float* __restrict x3 = kRanks > 3 ? grads[first + 3] + b : nullptr;
  for (int64_t i = 0; i < n; ++i) {
    float s = kStart ? x0[i] : g[i] + x0[i];
    if (kRanks > 1) s += x1[i];
    if (kRanks > 2) s += x2[i];
    if (kRanks > 3) s += x3[i];
    g[i] = s;
  }
}

// AddRanks for k (1 to 4) ranks, picked at run time.
template <bool kStart>
__attribute__((always_inline)) inline void AddSomeRanks(
    size_t k, float* __restrict g, const float* const* grads, size_t first,
    int64_t b, int64_t n) {
  switch (k) {
    case 1:
      AddRanks<1, kStart>(g, grads, first, b, n);
      break;
    case 2:
      AddRanks<2, kStart>(g, grads, first, b, n);
      break;
    case 3:
      AddRanks<3, kStart>(g, grads, first, b, n);
      break;
    default:
      AddRanks<4, kStart>(g, grads, first, b, n);
  }
}

// Sums the gradients of [begin, end) in rank order, block by block, and
// applies the update to each block while its sum is in L1, then encodes the
// block's new params into `copy` while they are in L1 too.
// The sum takes up to four ranks per pass over g: one load and store of g
// per element per pass, rather than per rank, nearly halves the time at 8
// ranks.
// kMultiply: the gradient count is a power of two, so g * (1 / count) is the
// same correctly rounded number as g / count (both round the exact g/2^k) and
// saves a division - the divider bounds this loop.
template <bool kMultiply>
__attribute__((always_inline)) inline void AverageAndUpdateRange(
    const Coefficients& c, const float* const* grads, size_t count,
    int64_t begin, int64_t end, float* params, float* m_all, float* v_all,
    const EncodedCopy& copy) {
  const size_t width = BytesPerValue(copy.encoding);
  alignas(64) float g[kBlock];
  for (int64_t b = begin; b < end; b += kBlock) {
    const int64_t n = std::min(kBlock, end - b);
    size_t r = std::min<size_t>(count, 4);
    AddSomeRanks<true>(r, g, grads, 0, b, n);
    for (; r < count; r += 4) {
      AddSomeRanks<false>(std::min<size_t>(count - r, 4), g, grads, r, b, n);
    }
    float* __restrict p = params + b;
    float* __restrict m = m_all + b;
    float* __restrict v = v_all + b;
    for (int64_t i = 0; i < n; ++i) {
      float gi = kMultiply ? g[i] * c.inv_count : g[i] / c.count;
      // clip_grad_norm_'s grad.mul_(clip_coef_clamped), before the step.
      gi *= c.clip;
      // AdamW's param.mul_(1 - lr * weight_decay), before anything reads p.
      p[i] *= c.decay;
      // torch.optim.Adam 1.13, operation by operation, as its AVX2 kernels
      // round them. grad.add(param, alpha=wd) and add_(grad, alpha) are
      // vec::fmadd, one rounding; wd is 0 by default and for AdamW (adds
      // +-0: exact).
      gi = std::fma(p[i], c.wd, gi);
      // exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
      m[i] = std::fma(gi, c.one_minus_beta1, m[i] * c.beta1);
      // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2): the
      // kernel's v + value * g * g is ((value * g) * g) + v, and GCC fuses
      // its last multiply and add into an FMA (tests/adam_test.cc checks the
      // bits against PyTorch's).
      v[i] = std::fma(c.one_minus_beta2 * gi, gi, v[i] * c.beta2);
      // (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
      const float denom = std::sqrt(v[i]) / c.bc2_sqrt + c.eps;
      // param.addcdiv_(exp_avg, denom, value=-step_size): p + value * m / d
      p[i] += (c.neg_step_size * m[i]) / denom;
    }
    if (copy.out != nullptr) Encode(copy.encoding, p, n, copy.out + b * width);
  }
}

// The divisor of the average (the number of ranks, which may be more than
// the gradients summed here: see AdamStepOnSum).
bool IsPowerOfTwo(float count) {
  const auto k = static_cast<uint32_t>(count);
  return (k & (k - 1)) == 0;
}

// Compiled twice: for AVX2 with FMA (8 floats a vector, FMA instructions)
// and for the x86-64 baseline (4), the summing loops included, and picked
// by what the CPU supports. Only correctly rounded operations (+ - * / sqrt
// fma) are used, and contraction of a * b + c into an FMA is off for this
// file (server/CMakeLists.txt), so both give the same bits on every
// machine; the baseline calls fmaf() for the FMAs, slower but rounding the
// same. Not templates: clang cannot retarget those.
__attribute__((target("avx2,fma"))) void AverageAndUpdateAvx2Fma(
    const Coefficients& c, const float* const* grads, size_t count,
    int64_t begin, int64_t end, float* params, float* m, float* v,
    const EncodedCopy& copy) {
  if (IsPowerOfTwo(c.count)) {
    AverageAndUpdateRange<true>(c, grads, count, begin, end, params, m, v,
                                copy);
  } else {
    AverageAndUpdateRange<false>(c, grads, count, begin, end, params, m, v,
                                 copy);
  }
}

void AverageAndUpdateBaseline(const Coefficients& c, const float* const* grads,
                              size_t count, int64_t begin, int64_t end,
                              float* params, float* m, float* v,
                              const EncodedCopy& copy) {
  if (IsPowerOfTwo(c.count)) {
    AverageAndUpdateRange<true>(c, grads, count, begin, end, params, m, v,
                                copy);
  } else {
    AverageAndUpdateRange<false>(c, grads, count, begin, end, params, m, v,
                                 copy);
  }
}

void AverageAndUpdate(const Coefficients& c, const float* const* grads,
                      size_t count, int64_t begin, int64_t end, float* params,
                      float* m, float* v, const EncodedCopy& copy) {
  static const bool avx2_fma =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  (avx2_fma ? AverageAndUpdateAvx2Fma : AverageAndUpdateBaseline)(
      c, grads, count, begin, end, params, m, v, copy);
}

// The operands of AddEncodedToSum.
struct EncodedSum {
  const char* bytes;
  float limit;
  const float* sum;  // null: the sum starts with the encoded gradient
  absl::Span<const float* const> kept;
  float* out;
};

// out[begin, end) = sum + the values of `bytes` + each kept gradient, block
// by block, checking each value of `bytes` as it is read; the first
// out-of-range one's index (its value in out), or -1. A block's values are
// also kept in L1 (`read`), so that the position is looked for in what was
// read - the bytes may have changed since - only when the block's
// branch-free OR-reduction fired. The kept gradients are added while the
// block of the sum is in L1, so out is written to memory once.
template <Encoding E, bool kStart>
__attribute__((always_inline)) inline int64_t AddEncodedRange(
    const EncodedSum& a, int64_t begin, int64_t end) {
  const char* __restrict bytes = a.bytes;
  const float limit = a.limit;
  alignas(64) float read[kBlock];
  for (int64_t b = begin; b < end; b += kBlock) {
    const int64_t n = std::min(kBlock, end - b);
    const float* __restrict sum = kStart ? nullptr : a.sum + b;
    float* __restrict out = a.out + b;
    uint32_t any = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float g = DecodedValue<E>(bytes, b + i);
      read[i] = g;
      out[i] = kStart ? g : sum[i] + g;
      any |= static_cast<uint32_t>(OutOfRange(g, limit));
    }
    if (any != 0) {
      for (int64_t i = 0; i < n; ++i) {
        if (OutOfRange(read[i], limit)) {
          out[i] = read[i];
          return b + i;
        }
      }
    }
    for (const float* kept : a.kept) {
      const float* __restrict x = kept + b;
      for (int64_t i = 0; i < n; ++i) out[i] += x[i];
    }
  }
  return -1;
}

// AddEncodedRange for the encoding and start picked at run time.
__attribute__((always_inline)) inline int64_t AddEncodedRangeOf(
    Encoding e, const EncodedSum& a, int64_t begin, int64_t end) {
  if (e == Encoding::kBf16) {
    return a.sum == nullptr
               ? AddEncodedRange<Encoding::kBf16, true>(a, begin, end)
               : AddEncodedRange<Encoding::kBf16, false>(a, begin, end);
  }
  return a.sum == nullptr
             ? AddEncodedRange<Encoding::kF32, true>(a, begin, end)
             : AddEncodedRange<Encoding::kF32, false>(a, begin, end);
}

// Compiled for AVX2 and for the baseline, as AverageAndUpdate: additions
// only, the same bits either way.
__attribute__((target("avx2"))) int64_t AddEncodedRangeAvx2(Encoding e,
                                                            const EncodedSum& a,
                                                            int64_t begin,
                                                            int64_t end) {
  return AddEncodedRangeOf(e, a, begin, end);
}

int64_t AddEncodedRangeBaseline(Encoding e, const EncodedSum& a, int64_t begin,
                                int64_t end) {
  return AddEncodedRangeOf(e, a, begin, end);
}

}  // namespace

namespace {

// The sum of the squares of the averaged gradient's n values, in double,
// element by element in order (the flat layout: tensor after tensor), so it
// is one number whatever the pool. Each value is the float average the
// update computes: the partial sums in rank order, then divided by `ranks`
// (multiplied by its inverse for a power of two, which rounds the same).
// A float's square is exact in double, so only the additions round.
double SumOfSquaresOfAverage(absl::Span<const float* const> grads, size_t ranks,
                             int64_t n) {
  const auto count = static_cast<float>(ranks);
  const float inv_count = 1.0f / count;
  const bool multiply = IsPowerOfTwo(count);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    float s = grads[0][i];
    for (size_t r = 1; r < grads.size(); ++r) s += grads[r][i];
    const double g = multiply ? s * inv_count : s / count;
    sum += g * g;
  }
  return sum;
}

// clip_grad_norm_(params, max_norm)'s factor for a gradient of global L2
// norm sqrt(sum_of_squares): min(1, max_norm / (norm + 1e-6)), in float32
// as torch computes it from its float32 norm (max_norm / tensor is
// tensor.reciprocal() * max_norm).
float ClipFactor(double max_norm, double sum_of_squares) {
  const auto norm = static_cast<float>(std::sqrt(sum_of_squares));
  const float coef =
      (1.0f / (norm + static_cast<float>(1e-6))) * static_cast<float>(max_norm);
  return std::min(coef, 1.0f);
}

// AverageAndAdamStep over `grads`, partial sums in rank order of `ranks`
// gradients in all.
void SumAndAdamStep(const AdamOptions& o, int64_t t, int64_t total_steps,
                    absl::Span<const float* const> grads, size_t ranks,
                    int64_t n, float* params, float* m, float* v,
                    WorkerPool* pool, const EncodedCopy& copy) {
  DP_CHECK(t >= 1 && !grads.empty() && ranks >= grads.size());
  // The schedule counts updates from 0, Adam from 1.
  const double lr = ScheduledLr(o, t - 1, total_steps);
  const float clip =
      o.clip_grad_norm > 0.0
          ? ClipFactor(o.clip_grad_norm, SumOfSquaresOfAverage(grads, ranks, n))
          : 1.0f;
  const bool adamw = o.decoupled_weight_decay;
  // Bias corrections in double, as torch computes them in Python floats.
  const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(t));
  // Like torch, scalars are Python floats (double) cast to float by the
  // kernels: 1 - beta1 is computed in double, then rounded.
  const Coefficients c{
      static_cast<float>(o.beta1),
      static_cast<float>(1.0 - o.beta1),
      static_cast<float>(o.beta2),
      static_cast<float>(1.0 - o.beta2),
      adamw ? 0.0f : static_cast<float>(o.weight_decay),
      static_cast<float>(o.eps),
      static_cast<float>(-(lr / bc1)),
      static_cast<float>(std::sqrt(bc2)),
      static_cast<float>(ranks),
      1.0f / static_cast<float>(ranks),
      clip,
      adamw ? static_cast<float>(1.0 - lr * o.weight_decay) : 1.0f};
  auto update = [&](int64_t begin, int64_t end) {
    AverageAndUpdate(c, grads.data(), grads.size(), begin, end, params, m, v,
                     copy);
  };
  if (pool == nullptr) {
    update(0, n);
  } else {
    // Ranges of whole blocks, so no block straddles two threads.
    pool->ParallelFor(n, kBlock, update);
  }
}

}  // namespace

void AverageAndAdamStep(const AdamOptions& o, int64_t t, int64_t total_steps,
                        absl::Span<const float* const> grads, int64_t n,
                        float* params, float* m, float* v, WorkerPool* pool) {
  SumAndAdamStep(o, t, total_steps, grads, grads.size(), n, params, m, v, pool,
                 EncodedCopy{});
}

int64_t AddEncodedToSum(Encoding e, const char* bytes, int64_t n, float limit,
                        const float* sum, absl::Span<const float* const> kept,
                        float* out, WorkerPool* pool) {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  const auto add_range = avx2 ? AddEncodedRangeAvx2 : AddEncodedRangeBaseline;
  const EncodedSum a{bytes, limit, sum, kept, out};
  if (pool == nullptr) return add_range(e, a, 0, n);
  // Each share stops at its first bad value; the first of all is the least.
  std::atomic<int64_t> first_bad{n};
  pool->ParallelFor(n, kBlock, [&](int64_t begin, int64_t end) {
    const int64_t bad = add_range(e, a, begin, end);
    if (bad < 0) return;
    int64_t least = first_bad.load(std::memory_order_relaxed);
    while (bad < least && !first_bad.compare_exchange_weak(
                              least, bad, std::memory_order_relaxed)) {
    }
  });
  const int64_t bad = first_bad.load(std::memory_order_relaxed);
  return bad < n ? bad : -1;
}

void AdamStepOnSum(const AdamOptions& o, int64_t t, int64_t total_steps,
                   const float* sum, int count, int64_t n, float* params,
                   float* m, float* v, WorkerPool* pool, EncodedCopy copy) {
  const float* const grads[] = {sum};
  SumAndAdamStep(o, t, total_steps, grads, static_cast<size_t>(count), n,
                 params, m, v, pool, copy);
}

}  // namespace dp
