// The float64 MLP of tests/reference_mlp.h.
#include "tests/reference_mlp.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "common/random.h"

namespace dp {

std::vector<double> ToDouble(absl::Span<const float> v) {
  return std::vector<double>(v.begin(), v.end());
}

SampleForward ForwardSample(const ModelLayout& layout,
                            absl::Span<const double> params,
                            absl::Span<const float> x) {
  const std::vector<int>& d = layout.dims();
  const int L = layout.num_layers();
  SampleForward out;
  out.min_abs_preactivation = std::numeric_limits<double>::infinity();
  std::vector<double> h(x.begin(), x.begin() + d[0]);
  for (int l = 0; l < L; ++l) {
    const double* w = params.data() + layout.weight(l).offset;  // (out, in)
    const double* b = params.data() + layout.bias(l).offset;    // (out)
    std::vector<double> y(d[l + 1]);
    for (int o = 0; o < d[l + 1]; ++o) {
      double acc = b[o];
      const double* row = w + static_cast<int64_t>(o) * d[l];
      for (int i = 0; i < d[l]; ++i) acc += row[i] * h[i];
      if (l + 1 < L) {
        out.active.push_back(acc > 0.0);
        out.min_abs_preactivation =
            std::min(out.min_abs_preactivation, std::fabs(acc));
        acc = acc > 0.0 ? acc : 0.0;
      }
      y[o] = acc;
    }
    h = std::move(y);
  }
  out.logits = std::move(h);
  return out;
}

double CrossEntropy(absl::Span<const double> logits, int label) {
  double m = logits[0];
  for (double z : logits) m = std::max(m, z);
  double sum = 0.0;
  for (double z : logits) sum += std::exp(z - m);
  return m + std::log(sum) - logits[label];
}

Reference RefForward(const ModelLayout& layout, absl::Span<const double> params,
                     const MlpBatch& batch) {
  const int D = layout.input_dim();
  const int n = static_cast<int>(batch.labels.size());
  Reference ref;
  for (int s = 0; s < n; ++s) {
    SampleForward f = ForwardSample(
        layout, params,
        absl::MakeConstSpan(batch.x).subspan(static_cast<size_t>(s) * D, D));
    const double loss = CrossEntropy(f.logits, batch.labels[s]);
    ref.losses.push_back(loss);
    ref.loss += loss / n;
    ref.logits.insert(ref.logits.end(), f.logits.begin(), f.logits.end());
    ref.active.insert(ref.active.end(), f.active.begin(), f.active.end());
  }
  return ref;
}

std::vector<std::optional<double>> CentralDifferences(
    const ModelLayout& layout, std::vector<double> params,
    const MlpBatch& batch, const std::vector<int64_t>& which, double h) {
  const std::vector<char> active = RefForward(layout, params, batch).active;
  std::vector<std::optional<double>> out;
  out.reserve(which.size());
  for (int64_t k : which) {
    const double saved = params[k];
    params[k] = saved + h;
    const Reference plus = RefForward(layout, params, batch);
    params[k] = saved - h;
    const Reference minus = RefForward(layout, params, batch);
    params[k] = saved;
    if (plus.active != active || minus.active != active) {
      out.push_back(std::nullopt);
    } else {
      out.push_back((plus.loss - minus.loss) / (2.0 * h));
    }
  }
  return out;
}

std::string ParamName(const ModelLayout& layout, int64_t k) {
  for (const TensorInfo& t : layout.tensors()) {
    if (k >= t.offset && k < t.offset + t.size) {
      return t.name + "[" + std::to_string(k - t.offset) + "]";
    }
  }
  return "?";
}

Comparison CompareWithTolerance(absl::Span<const double> got,
                                absl::Span<const double> want, double atol,
                                double rtol,
                                const std::function<std::string(size_t)>& name,
                                const char* got_label, const char* want_label) {
  constexpr int kShow = 10;
  Comparison c;
  for (size_t i = 0; i < want.size(); ++i) {
    const double diff = std::fabs(got[i] - want[i]);
    const double tol = atol + rtol * std::fabs(want[i]);
    c.diff_l2 += diff * diff;
    c.ref_l2 += want[i] * want[i];
    if (!(diff <= tol)) {
      if (c.mismatches < kShow) {
        std::printf("  mismatch %s: %s %.9g %s %.9g |diff| %.3g > %.3g\n",
                    name(i).c_str(), got_label, got[i], want_label, want[i],
                    diff, tol);
      }
      ++c.mismatches;
    }
    if (diff > c.max_abs || std::isnan(diff)) c.max_abs = diff;
  }
  return c;
}

namespace {

// n samples from (seed, stream 11), each redrawn until `accept` takes it.
MlpBatch DrawBatch(const ModelLayout& layout, int n, uint64_t seed,
                   const std::function<bool(absl::Span<const float>)>& accept) {
  constexpr int kMaxDraws = 1000;
  Rng rng(seed, 11);
  const int D = layout.input_dim();
  MlpBatch b;
  b.x.resize(static_cast<size_t>(n) * D);
  for (int s = 0; s < n; ++s) {
    absl::Span<float> xs =
        absl::MakeSpan(b.x).subspan(static_cast<size_t>(s) * D, D);
    int draws = 0;
    do {
      if (++draws > kMaxDraws) {
        std::fprintf(stderr,
                     "%s:%d: sample %d of a batch of %d (seed %llu): %d "
                     "draws, none far from the kinks\n",
                     __FILE__, __LINE__, s, n,
                     static_cast<unsigned long long>(seed), kMaxDraws);
        std::abort();
      }
      for (float& v : xs) v = static_cast<float>(rng.Normal());
    } while (!accept(xs));
    b.labels.push_back(static_cast<int32_t>(rng.Below(layout.num_classes())));
  }
  return b;
}

}  // namespace

MlpBatch RandomMlpBatch(const ModelLayout& layout, int n, uint64_t seed) {
  return DrawBatch(layout, n, seed,
                   [](absl::Span<const float>) { return true; });
}

MlpBatch MlpBatchFarFromKinks(const ModelLayout& layout,
                              const std::vector<float>& params, int n,
                              uint64_t seed, double margin) {
  const std::vector<double> p = ToDouble(params);
  return DrawBatch(layout, n, seed, [&](absl::Span<const float> x) {
    const SampleForward f = ForwardSample(layout, p, x);
    if (f.min_abs_preactivation < margin) return false;
    std::vector<double> z = f.logits;
    std::sort(z.begin(), z.end());
    return z.size() < 2 || z[z.size() - 1] - z[z.size() - 2] >= margin;
  });
}

}  // namespace dp
