// CPU reference backend: OpenBLAS sgemm for every matrix product, plain loops
// for the fused element-wise parts (bias+ReLU, softmax+cross-entropy, ReLU
// backward, bias gradient). Shapes: B = batch, weights are (out, in) row-major.
#include "worker/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace dp {
namespace {

// y (B,out) = x (B,in) * w^T (in,out); w is (out,in) row-major.
void MatmulForward(const float* x, const float* w, float* y, int B, int in,
                   int out) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, out, in, 1.0f, x, in,
              w, in, 0.0f, y, out);
}

// GCC at -O2 auto-vectorizes only loops whose trip count it knows, so the
// element-wise loops below run in blocks of kLanes (SIMD, branch-free) plus a
// scalar tail. A branch per element on the sign of an activation is
// unpredictable; it made the step ~1.5x slower at batch 64.
constexpr int kLanes = 8;

// torch.relu: NaN passes through (NaN < 0 is false).
inline float Relu(float v) { return v < 0.0f ? 0.0f : v; }

// y (B,out) += bias (out), then ReLU in place when relu is set.
void BiasRelu(float* y, const float* __restrict bias, int B, int out,
              bool relu) {
  for (int i = 0; i < B; ++i) {
    float* __restrict row = y + static_cast<int64_t>(i) * out;
    int j = 0;
    if (relu) {
      for (; j + kLanes <= out; j += kLanes) {
        for (int k = 0; k < kLanes; ++k) {
          row[j + k] = Relu(row[j + k] + bias[j + k]);
        }
      }
      for (; j < out; ++j) row[j] = Relu(row[j] + bias[j]);
    } else {
      for (; j + kLanes <= out; j += kLanes) {
        for (int k = 0; k < kLanes; ++k) row[j + k] += bias[j + k];
      }
      for (; j < out; ++j) row[j] += bias[j];
    }
  }
}

// Numerically stable softmax pieces of one row z (C): returns the row max m
// and s = sum_j exp(z_j - m), so log(sum_j exp(z_j)) = m + log(s). Writes
// e_j = exp(z_j - m) into e (C) when e is not null.
struct ShiftedExpSum {
  float max;
  float sum;
  float LogSumExp() const { return max + std::log(sum); }
};
ShiftedExpSum ExpRow(const float* z, int C, float* e) {
  float m = z[0];
  for (int j = 1; j < C; ++j) m = std::max(m, z[j]);
  float s = 0.0f;
  for (int j = 0; j < C; ++j) {
    const float ej = std::exp(z[j] - m);
    if (e != nullptr) e[j] = ej;
    s += ej;
  }
  return {m, s};
}

// logits (B,C), labels (B) -> dlogits (B,C) = (softmax - onehot) / B.
// Returns the mean cross-entropy over the batch.
float SoftmaxCrossEntropy(const float* logits, const int32_t* labels,
                          float* dlogits, int B, int C) {
  const float inv_b = 1.0f / static_cast<float>(B);
  double loss_sum = 0.0;
  for (int i = 0; i < B; ++i) {
    const float* z = logits + static_cast<int64_t>(i) * C;
    float* dz = dlogits + static_cast<int64_t>(i) * C;
    const ShiftedExpSum r = ExpRow(z, C, dz);
    loss_sum += static_cast<double>(r.LogSumExp() - z[labels[i]]);
    const float scale = inv_b / r.sum;
    for (int j = 0; j < C; ++j) dz[j] *= scale;
    dz[labels[i]] -= inv_b;
  }
  return static_cast<float>(loss_sum / B);
}

// db (out) = column sums of dy (B,out), rows added in order 0..B-1.
void ColumnSums(const float* __restrict dy, float* __restrict db, int B,
                int out) {
  std::fill(db, db + out, 0.0f);
  for (int i = 0; i < B; ++i) {
    const float* row = dy + static_cast<int64_t>(i) * out;
    int j = 0;
    for (; j + kLanes <= out; j += kLanes) {
      for (int k = 0; k < kLanes; ++k) db[j + k] += row[j + k];
    }
    for (; j < out; ++j) db[j] += row[j];
  }
}

// dw (out,in) = dy^T (out,B) * x (B,in); db (out) = column sums of dy (B,out).
void LinearBackwardParams(const float* dy, const float* x, float* dw, float* db,
                          int B, int in, int out) {
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, B, 1.0f, dy,
              out, x, in, 0.0f, dw, in);
  ColumnSums(dy, db, B, out);
}

// dx (B,in) = (dy (B,out) * w (out,in)), zeroed where the ReLU output x (B,in)
// is <= 0 (torch's threshold_backward: a NaN output passes the gradient).
void LinearReluBackwardInput(const float* dy, const float* w,
                             const float* __restrict x, float* __restrict dx,
                             int B, int in, int out) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, in, out, 1.0f, dy,
              out, w, in, 0.0f, dx, in);
  const int64_t n = static_cast<int64_t>(B) * in;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      dx[i + k] = x[i + k] <= 0.0f ? 0.0f : dx[i + k];
    }
  }
  for (; i < n; ++i) dx[i] = x[i] <= 0.0f ? 0.0f : dx[i];
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(
    const ModelLayout& layout, const BackendOptions& options) {
  if (options.max_batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cpu backend: max_batch must be >= 1, got ", options.max_batch));
  }
  if (options.cpu_threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cpu backend: cpu_threads must be >= 1, got ", options.cpu_threads));
  }
  openblas_set_num_threads(options.cpu_threads);
  return std::unique_ptr<CpuBackend>(new CpuBackend(layout, options));
}

CpuBackend::CpuBackend(const ModelLayout& layout, const BackendOptions& options)
    : layout_(layout),
      max_batch_(options.max_batch),
      params_(layout.num_params(), 0.0f),
      tensors_(layout.tensors().size(), nullptr) {
  const std::vector<int>& d = layout_.dims();
  const int L = layout_.num_layers();
  int max_hidden = 0;
  for (int l = 0; l < L; ++l) {
    act_.emplace_back(static_cast<size_t>(max_batch_) * d[l + 1]);
    if (l + 1 < L) max_hidden = std::max(max_hidden, d[l + 1]);
  }
  for (std::vector<float>& buf : dbuf_) {
    buf.resize(static_cast<size_t>(max_batch_) * max_hidden);
  }
  dlogits_.resize(static_cast<size_t>(max_batch_) * layout_.num_classes());
}

absl::Status CpuBackend::SetWeights(absl::Span<const float> params) {
  if (static_cast<int64_t>(params.size()) != layout_.num_params()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SetWeights: got ", params.size(), " floats, the model has ",
        layout_.num_params(), " parameters"));
  }
  std::copy(params.begin(), params.end(), params_.begin());
  UseOwnWeights();
  return absl::OkStatus();
}

absl::Status CpuBackend::TakeWeights(std::vector<float>* params) {
  if (static_cast<int64_t>(params->size()) != layout_.num_params()) {
    return SetWeights(*params);  // the size error
  }
  params_.swap(*params);
  UseOwnWeights();
  return absl::OkStatus();
}

absl::Status CpuBackend::ViewWeights(
    absl::Span<const absl::Span<const float>> tensors) {
  RETURN_IF_ERROR(CheckTensorViews(layout_, tensors));
  for (size_t i = 0; i < tensors.size(); ++i) tensors_[i] = tensors[i].data();
  weights_set_ = true;
  return absl::OkStatus();
}

void CpuBackend::UseOwnWeights() {
  const std::vector<TensorInfo>& t = layout_.tensors();
  for (size_t i = 0; i < t.size(); ++i) {
    tensors_[i] = params_.data() + t[i].offset;
  }
  weights_set_ = true;
}

void CpuBackend::Forward(const float* x, int B) {
  const std::vector<int>& d = layout_.dims();
  const int L = layout_.num_layers();
  const float* in = x;
  for (int l = 0; l < L; ++l) {
    float* y = act_[l].data();
    MatmulForward(in, weight(l), y, B, d[l], d[l + 1]);
    BiasRelu(y, bias(l), B, d[l + 1], /*relu=*/l + 1 < L);
    in = y;
  }
}

absl::StatusOr<float> CpuBackend::ForwardBackward(
    absl::Span<const float> x, absl::Span<const int32_t> labels,
    absl::Span<float> grad) {
  RETURN_IF_ERROR(CheckBackendInputs("ForwardBackward", layout_, weights_set_,
                                     max_batch_, x, labels));
  const int B = static_cast<int>(labels.size());
  if (static_cast<int64_t>(grad.size()) != layout_.num_params()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ForwardBackward: grad has ", grad.size(), " floats, the model has ",
        layout_.num_params(), " parameters"));
  }

  const std::vector<int>& d = layout_.dims();
  const int L = layout_.num_layers();
  Forward(x.data(), B);
  const float loss = SoftmaxCrossEntropy(act_[L - 1].data(), labels.data(),
                                         dlogits_.data(), B, d[L]);

  // Backward, last layer first. dy (B, d[l+1]) is the gradient w.r.t. the
  // output of layer l (pre-activation: ReLU backward is already applied).
  const float* dy = dlogits_.data();
  for (int l = L - 1; l >= 0; --l) {
    const float* in = l == 0 ? x.data() : act_[l - 1].data();
    LinearBackwardParams(dy, in, grad.data() + layout_.weight(l).offset,
                         grad.data() + layout_.bias(l).offset, B, d[l],
                         d[l + 1]);
    if (l > 0) {  // no gradient w.r.t. the input data
      float* dx = dbuf_[l % 2].data();
      LinearReluBackwardInput(dy, weight(l), in, dx, B, d[l], d[l + 1]);
      dy = dx;
    }
  }
  return loss;
}

absl::StatusOr<EvalResult> CpuBackend::Evaluate(
    absl::Span<const float> x, absl::Span<const int32_t> labels) {
  RETURN_IF_ERROR(CheckBackendInputs("Evaluate", layout_, weights_set_,
                                     /*max_batch=*/0, x, labels));
  const int64_t n = static_cast<int64_t>(labels.size());

  const int C = layout_.num_classes();
  const int L = layout_.num_layers();
  EvalResult result;
  for (int64_t start = 0; start < n; start += max_batch_) {
    const int B = static_cast<int>(std::min<int64_t>(max_batch_, n - start));
    Forward(x.data() + start * layout_.input_dim(), B);
    for (int i = 0; i < B; ++i) {
      const float* z = act_[L - 1].data() + static_cast<int64_t>(i) * C;
      const int32_t label = labels[start + i];
      int arg = 0;
      for (int j = 1; j < C; ++j) {
        if (z[j] > z[arg]) arg = j;
      }
      result.correct += arg == label;
      result.loss_sum +=
          static_cast<double>(ExpRow(z, C, nullptr).LogSumExp() - z[label]);
    }
  }
  result.count = n;
  return result;
}

}  // namespace dp
