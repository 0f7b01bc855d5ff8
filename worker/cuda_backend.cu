// CudaBackend: the CPU reference's forward/backward on one CUDA device.
// cuBLAS SGEMM for every matrix product (row-major via the transposition
// trick: a row-major (r,c) matrix is a column-major (c,r) one), the fused
// kernels of cuda_kernels.cu for the rest, one stream, weights resident on the
// device, pinned staging buffers for every host<->device copy, and optionally
// one CUDA graph per batch size for the whole forward+backward.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/types/span.h"
#include "common/model_layout.h"
#include "common/status_macros.h"
#include "worker/cuda_backend.h"
#include "worker/cuda_kernels.cuh"

namespace dp {
namespace {

absl::Status CublasErrorStatus(cublasStatus_t status, const char* expr,
                               const char* file, int line) {
  std::string message = absl::StrCat(file, ":", line, ": ", expr, ": ",
                                     cublasGetStatusName(status), ": ",
                                     cublasGetStatusString(status));
  if (status == CUBLAS_STATUS_ALLOC_FAILED) {
    return absl::ResourceExhaustedError(message);
  }
  if (status == CUBLAS_STATUS_ARCH_MISMATCH ||
      status == CUBLAS_STATUS_NOT_INITIALIZED) {
    return absl::FailedPreconditionError(message);
  }
  return absl::InternalError(message);
}

#define CUBLAS_RETURN_IF_ERROR(expr)                                          \
  do {                                                                        \
    const cublasStatus_t dp_cublas_status_ = (expr);                          \
    if (dp_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                         \
      return CublasErrorStatus(dp_cublas_status_, #expr, __FILE__, __LINE__); \
    }                                                                         \
  } while (0)

// *out owns a fresh buffer of max(n, 1) T: device memory for a DevicePtr,
// pinned host memory for a PinnedPtr.
template <typename T, typename Free>
absl::Status Alloc(int64_t n, std::unique_ptr<T, Free>* out) {
  void* p = nullptr;
  const size_t bytes = std::max<int64_t>(n, 1) * sizeof(T);
  if constexpr (std::is_same_v<Free, CudaFreeHost>) {
    CUDA_RETURN_IF_ERROR(cudaMallocHost(&p, bytes));
  } else {
    CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
  }
  out->reset(static_cast<T*>(p));
  return absl::OkStatus();
}

// Host->device copies of the input go through pinned memory in chunks, so
// the memcpy of chunk k+1 overlaps the DMA of chunk k.
constexpr int64_t kStagingChunkBytes = int64_t{1} << 20;
// cuBLAS workspace: fixed, so that graph capture never allocates and the
// algorithm choice (and with it the bits of the result) never changes.
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
// Batch sizes with a captured graph; others run launch by launch.
constexpr size_t kMaxGraphs = 8;

class CudaBackendImpl final : public CudaBackend {
 public:
  CudaBackendImpl(const ModelLayout& layout, const BackendOptions& options,
                  const CudaOptions& cuda_options)
      : layout_(layout),
        max_batch_(options.max_batch),
        tf32_(options.tf32),
        device_(options.device),
        cuda_options_(cuda_options) {}

  ~CudaBackendImpl() override {
    cudaSetDevice(device_);
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    for (auto& [batch, exec] : graphs_) cudaGraphExecDestroy(exec);
    if (cublas_ != nullptr) cublasDestroy(cublas_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  absl::Status Init();

  std::string Name() const override { return name_; }

  absl::Status SetWeights(absl::Span<const float> params) override;
  absl::StatusOr<float> ForwardBackward(absl::Span<const float> x,
                                        absl::Span<const int32_t> labels,
                                        absl::Span<float> grad) override;
  absl::StatusOr<EvalResult> Evaluate(
      absl::Span<const float> x, absl::Span<const int32_t> labels) override;
  absl::Status UploadBatch(absl::Span<const float> x,
                           absl::Span<const int32_t> labels) override;
  absl::Status ComputeUploaded() override;

 private:
  // Every public call starts here: the caller's thread may have another
  // current device.
  absl::Status UseDevice();
  // Waits for the stream; the staging buffers are then free.
  absl::Status Sync();
  absl::Status CheckBatch(const char* what, absl::Span<const float> x,
                          absl::Span<const int32_t> labels) const;
  // Copies n samples to x_ and labels_ (asynchronously, on stream_).
  absl::Status StageInputs(const float* x, const int32_t* labels, int n);
  // Enqueues the forward pass of x_ (B rows): act_[l] is layer l's output.
  absl::Status EnqueueForward(int B);
  // Enqueues forward, loss and backward of x_ (B rows): gradient in grad_,
  // per-sample losses in grad_ + num_params.
  absl::Status EnqueueForwardBackward(int B);
  // EnqueueForwardBackward as a replayed graph when graphs are on.
  absl::Status LaunchForwardBackward(int B);
  absl::StatusOr<cudaGraphExec_t> Capture(int B);

  // y (B,out) = x (B,in) W^T, W (out,in).
  absl::Status GemmForward(const float* x, const float* w, float* y, int B,
                           int in, int out);
  // dW (out,in) = dy^T (out,B) x (B,in).
  absl::Status GemmWeightGrad(const float* dy, const float* x, float* dw, int B,
                              int in, int out);
  // dx (B,in) = dy (B,out) W (out,in).
  absl::Status GemmInputGrad(const float* dy, const float* w, float* dx, int B,
                             int in, int out);
  // C (m,n) = op_a(A) . op_b(B), column-major, on stream_: the one cuBLAS
  // call of the three above, which differ only in operands and shapes.
  absl::Status Sgemm(cublasOperation_t op_a, cublasOperation_t op_b, int m,
                     int n, int k, const float* a, int lda, const float* b,
                     int ldb, float* c, int ldc);

  const ModelLayout layout_;
  const int max_batch_;
  const bool tf32_;
  const int device_;
  const CudaOptions cuda_options_;
  bool tf32_in_use_ = false;  // asked for, and the device has it
  std::string name_;

  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  // A copy out of the staging buffers may still run: Sync before reuse.
  bool staging_busy_ = false;
  std::map<int, cudaGraphExec_t> graphs_;  // by batch size
  std::set<int> seen_batches_;             // sizes run at least once
  // A capture failed: launch one by one from then on.
  bool capture_failed_ = false;

  bool weights_set_ = false;
  int uploaded_batch_ = 0;  // rows in x_ since the last UploadBatch

  // Device buffers, all sized for max_batch_.
  DevicePtr<float> params_;            // (num_params)
  DevicePtr<float> grad_;              // (num_params + max_batch): grads,
                                       // then per-sample losses
  DevicePtr<float> x_;                 // (max_batch, input_dim)
  DevicePtr<int32_t> labels_;          // (max_batch)
  std::vector<DevicePtr<float>> act_;  // act_[l] is (max_batch, dims[l+1])
  DevicePtr<float> dbuf_[2];           // (max_batch, max hidden dim) each
  DevicePtr<float> dlogits_;           // (max_batch, num_classes)
  DevicePtr<int32_t> correct_;         // (max_batch)
  DevicePtr<float> partials_;          // column-sum chunk partials
  DevicePtr<unsigned> counters_;       // column-sum tile counters
  DevicePtr<char> workspace_;          // cuBLAS

  // Pinned host staging buffers.
  PinnedPtr<float> h_params_;     // (num_params)
  PinnedPtr<float> h_grad_;       // (num_params + max_batch)
  PinnedPtr<float> h_x_;          // (max_batch, input_dim)
  PinnedPtr<int32_t> h_labels_;   // (max_batch)
  PinnedPtr<int32_t> h_correct_;  // (max_batch)
};

absl::Status CudaBackendImpl::UseDevice() {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  return absl::OkStatus();
}

absl::Status CudaBackendImpl::Sync() {
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  staging_busy_ = false;
  return absl::OkStatus();
}

absl::Status CudaBackendImpl::Init() {
  ASSIGN_OR_RETURN(const GpuInfo gpu, OpenCudaDevice(device_));
  // Tensor cores do TF32 from compute capability 8.0 (Ampere) on; below it
  // cuBLAS ignores the mode and computes in float32.
  tf32_in_use_ = tf32_ && gpu.cc_major >= 8;
  name_ = absl::StrCat("cuda (", gpu.name, ", device ", device_,
                       tf32_in_use_ ? ", tf32" : "", ")");

  CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  CUBLAS_RETURN_IF_ERROR(cublasCreate(&cublas_));
  CUBLAS_RETURN_IF_ERROR(cublasSetStream(cublas_, stream_));
  // Plain float32 FMA unless TF32 is asked for; never atomics (determinism).
  CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(
      cublas_, tf32_ ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  CUBLAS_RETURN_IF_ERROR(
      cublasSetAtomicsMode(cublas_, CUBLAS_ATOMICS_NOT_ALLOWED));
  RETURN_IF_ERROR(Alloc(kCublasWorkspaceBytes, &workspace_));
  CUBLAS_RETURN_IF_ERROR(
      cublasSetWorkspace(cublas_, workspace_.get(), kCublasWorkspaceBytes));

  const std::vector<int>& d = layout_.dims();
  const int L = layout_.num_layers();
  const int64_t P = layout_.num_params();
  const int64_t B = max_batch_;
  int max_hidden = 1;
  int max_out = 1;
  for (int l = 0; l < L; ++l) {
    max_out = std::max(max_out, d[l + 1]);
    if (l + 1 < L) max_hidden = std::max(max_hidden, d[l + 1]);
  }
  RETURN_IF_ERROR(Alloc(P, &params_));
  RETURN_IF_ERROR(Alloc(P + B, &grad_));
  RETURN_IF_ERROR(Alloc(B * layout_.input_dim(), &x_));
  RETURN_IF_ERROR(Alloc(B, &labels_));
  act_.resize(L);
  for (int l = 0; l < L; ++l) RETURN_IF_ERROR(Alloc(B * d[l + 1], &act_[l]));
  for (DevicePtr<float>& buf : dbuf_) {
    RETURN_IF_ERROR(Alloc(B * max_hidden, &buf));
  }
  RETURN_IF_ERROR(Alloc(B * layout_.num_classes(), &dlogits_));
  RETURN_IF_ERROR(Alloc(B, &correct_));
  RETURN_IF_ERROR(Alloc(
      static_cast<int64_t>(ColumnSumChunks(max_batch_)) * max_out, &partials_));
  RETURN_IF_ERROR(Alloc(ColumnSumTiles(max_out), &counters_));

  RETURN_IF_ERROR(Alloc(P, &h_params_));
  RETURN_IF_ERROR(Alloc(P + B, &h_grad_));
  RETURN_IF_ERROR(Alloc(B * layout_.input_dim(), &h_x_));
  RETURN_IF_ERROR(Alloc(B, &h_labels_));
  RETURN_IF_ERROR(Alloc(B, &h_correct_));
  return Sync();
}

absl::Status CudaBackendImpl::SetWeights(absl::Span<const float> params) {
  RETURN_IF_ERROR(UseDevice());
  const int64_t P = layout_.num_params();
  if (static_cast<int64_t>(params.size()) != P) {
    return absl::InvalidArgumentError(
        absl::StrCat("SetWeights: got ", params.size(),
                     " floats, the model has ", P, " parameters"));
  }
  // A step ends with Sync, so this waits only after an UploadBatch or a
  // SetWeights with no step since.
  if (staging_busy_) RETURN_IF_ERROR(Sync());
  std::memcpy(h_params_.get(), params.data(), P * sizeof(float));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(params_.get(), h_params_.get(),
                                       P * sizeof(float),
                                       cudaMemcpyHostToDevice, stream_));
  staging_busy_ = true;
  weights_set_ = true;
  return absl::OkStatus();
}

absl::Status CudaBackendImpl::CheckBatch(
    const char* what, absl::Span<const float> x,
    absl::Span<const int32_t> labels) const {
  return CheckBackendInputs(what, layout_, weights_set_, max_batch_, x, labels);
}

absl::Status CudaBackendImpl::StageInputs(const float* x, const int32_t* labels,
                                          int n) {
  if (staging_busy_) RETURN_IF_ERROR(Sync());
  const int64_t x_bytes =
      static_cast<int64_t>(n) * layout_.input_dim() * sizeof(float);
  char* dst = reinterpret_cast<char*>(x_.get());
  char* stage = reinterpret_cast<char*>(h_x_.get());
  const char* src = reinterpret_cast<const char*>(x);
  for (int64_t off = 0; off < x_bytes; off += kStagingChunkBytes) {
    const int64_t len = std::min(kStagingChunkBytes, x_bytes - off);
    std::memcpy(stage + off, src + off, len);
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst + off, stage + off, len,
                                         cudaMemcpyHostToDevice, stream_));
  }
  std::memcpy(h_labels_.get(), labels, n * sizeof(int32_t));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(labels_.get(), h_labels_.get(),
                                       n * sizeof(int32_t),
                                       cudaMemcpyHostToDevice, stream_));
  staging_busy_ = true;
  return absl::OkStatus();
}

absl::Status CudaBackendImpl::Sgemm(cublasOperation_t op_a,
                                    cublasOperation_t op_b, int m, int n, int k,
                                    const float* a, int lda, const float* b,
                                    int ldb, float* c, int ldc) {
  const float one = 1.0f, zero = 0.0f;
  CUBLAS_RETURN_IF_ERROR(cublasSgemm(cublas_, op_a, op_b, m, n, k, &one, a, lda,
                                     b, ldb, &zero, c, ldc));
  return absl::OkStatus();
}

absl::Status CudaBackendImpl::GemmForward(const float* x, const float* w,
                                          float* y, int B, int in, int out) {
  // Column-major: y^T (out,B) = W (out,in) . x^T (in,B); W is stored as
  // column-major (in,out), hence OP_T.
  return Sgemm(CUBLAS_OP_T, CUBLAS_OP_N, out, B, in, w, in, x, in, y, out);
}

absl::Status CudaBackendImpl::GemmWeightGrad(const float* dy, const float* x,
                                             float* dw, int B, int in,
                                             int out) {
  // Column-major: dW^T (in,out) = x^T (in,B) . dy (B,out); dy is stored as
  // column-major (out,B), hence OP_T.
  return Sgemm(CUBLAS_OP_N, CUBLAS_OP_T, in, out, B, x, in, dy, out, dw, in);
}

absl::Status CudaBackendImpl::GemmInputGrad(const float* dy, const float* w,
                                            float* dx, int B, int in, int out) {
  // Column-major: dx^T (in,B) = W^T (in,out) . dy^T (out,B).
  return Sgemm(CUBLAS_OP_N, CUBLAS_OP_N, in, B, out, w, in, dy, out, dx, in);
}

absl::Status CudaBackendImpl::EnqueueForward(int B) {
  const std::vector<int>& d = layout_.dims();
  const int L = layout_.num_layers();
  const float* in = x_.get();
  for (int l = 0; l < L; ++l) {
    const float* w = params_.get() + layout_.weight(l).offset;
    const float* b = params_.get() + layout_.bias(l).offset;
    float* y = act_[l].get();
    RETURN_IF_ERROR(GemmForward(in, w, y, B, d[l], d[l + 1]));
    CUDA_RETURN_IF_ERROR(
        LaunchBiasRelu(y, b, B, d[l + 1], /*relu=*/l + 1 < L, stream_));
    in = y;
  }
  return absl::OkStatus();
}

absl::Status CudaBackendImpl::EnqueueForwardBackward(int B) {
  const std::vector<int>& d = layout_.dims();
  const int L = layout_.num_layers();
  float* grad = grad_.get();
  float* row_loss = grad + layout_.num_params();
  RETURN_IF_ERROR(EnqueueForward(B));
  CUDA_RETURN_IF_ERROR(LaunchSoftmaxCrossEntropy(act_[L - 1].get(),
                                                 labels_.get(), dlogits_.get(),
                                                 row_loss, B, d[L], stream_));
  CUDA_RETURN_IF_ERROR(LaunchColumnSums(
      dlogits_.get(), /*act=*/nullptr, grad + layout_.bias(L - 1).offset, B,
      d[L], partials_.get(), counters_.get(), stream_));

  // Backward, last layer first. dy (B, d[l+1]) is the gradient w.r.t. the
  // output of layer l before its ReLU; the bias gradient of layer l is done.
  float* dy = dlogits_.get();
  for (int l = L - 1; l >= 0; --l) {
    const float* in = l == 0 ? x_.get() : act_[l - 1].get();
    RETURN_IF_ERROR(GemmWeightGrad(dy, in, grad + layout_.weight(l).offset, B,
                                   d[l], d[l + 1]));
    if (l > 0) {  // no gradient w.r.t. the input data
      float* dx = dbuf_[l % 2].get();
      RETURN_IF_ERROR(GemmInputGrad(
          dy, params_.get() + layout_.weight(l).offset, dx, B, d[l], d[l + 1]));
      // ReLU backward through layer l-1's output, fused with its bias grad.
      CUDA_RETURN_IF_ERROR(LaunchColumnSums(
          dx, act_[l - 1].get(), grad + layout_.bias(l - 1).offset, B, d[l],
          partials_.get(), counters_.get(), stream_));
      dy = dx;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<cudaGraphExec_t> CudaBackendImpl::Capture(int B) {
  CUDA_RETURN_IF_ERROR(
      cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  const absl::Status enqueued =
      cuda_options_.fail_captures_for_testing
          ? absl::InternalError("capture failed (fail_captures_for_testing)")
          : EnqueueForwardBackward(B);
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
  if (!enqueued.ok()) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    return enqueued;
  }
  CUDA_RETURN_IF_ERROR(ended);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  CUDA_RETURN_IF_ERROR(instantiated);
  return exec;
}

absl::Status CudaBackendImpl::LaunchForwardBackward(int B) {
  if (!cuda_options_.graphs || capture_failed_) {
    return EnqueueForwardBackward(B);
  }
  auto it = graphs_.find(B);
  if (it == graphs_.end()) {
    // The first step of a batch size runs launch by launch: it loads every
    // kernel module (lazy loading) and settles cuBLAS's choices outside of
    // any capture, and one-off sizes never cost a capture.
    if (seen_batches_.insert(B).second || graphs_.size() >= kMaxGraphs) {
      return EnqueueForwardBackward(B);
    }
    absl::StatusOr<cudaGraphExec_t> exec = Capture(B);
    if (!exec.ok()) {
      // Graphs are an optimisation: a capture can fail where the same
      // launches work one by one (a library call that may not be captured,
      // a driver's limit). Nothing of the failed capture ran, so this step
      // and every later one launch one by one; retrying the capture every
      // step would fail them all.
      cudaGetLastError();  // clear it, so that later calls do not report it
      capture_failed_ = true;
      std::fprintf(stderr,
                   "cuda backend: graph capture failed (%s); launching "
                   "kernels one by one from now on\n",
                   exec.status().ToString().c_str());
      return EnqueueForwardBackward(B);
    }
    it = graphs_.emplace(B, *exec).first;
  }
  CUDA_RETURN_IF_ERROR(cudaGraphLaunch(it->second, stream_));
  return absl::OkStatus();
}

absl::StatusOr<float> CudaBackendImpl::ForwardBackward(
    absl::Span<const float> x, absl::Span<const int32_t> labels,
    absl::Span<float> grad) {
  RETURN_IF_ERROR(UseDevice());
  RETURN_IF_ERROR(CheckBatch("ForwardBackward", x, labels));
  const int64_t P = layout_.num_params();
  if (static_cast<int64_t>(grad.size()) != P) {
    return absl::InvalidArgumentError(
        absl::StrCat("ForwardBackward: grad has ", grad.size(),
                     " floats, the model has ", P, " parameters"));
  }
  const int B = static_cast<int>(labels.size());
  RETURN_IF_ERROR(StageInputs(x.data(), labels.data(), B));
  uploaded_batch_ = B;
  RETURN_IF_ERROR(LaunchForwardBackward(B));
  // Gradients and per-sample losses in one copy.
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h_grad_.get(), grad_.get(),
                                       (P + B) * sizeof(float),
                                       cudaMemcpyDeviceToHost, stream_));
  RETURN_IF_ERROR(Sync());
  std::memcpy(grad.data(), h_grad_.get(), P * sizeof(float));
  // The mean loss exactly as the CPU reference: float per-sample losses
  // added in sample order in double.
  double loss_sum = 0.0;
  const float* row_loss = h_grad_.get() + P;
  for (int i = 0; i < B; ++i) loss_sum += static_cast<double>(row_loss[i]);
  return static_cast<float>(loss_sum / B);
}

absl::Status CudaBackendImpl::UploadBatch(absl::Span<const float> x,
                                          absl::Span<const int32_t> labels) {
  RETURN_IF_ERROR(UseDevice());
  RETURN_IF_ERROR(CheckBatch("UploadBatch", x, labels));
  const int B = static_cast<int>(labels.size());
  RETURN_IF_ERROR(StageInputs(x.data(), labels.data(), B));
  uploaded_batch_ = B;
  return absl::OkStatus();
}

absl::Status CudaBackendImpl::ComputeUploaded() {
  RETURN_IF_ERROR(UseDevice());
  if (uploaded_batch_ == 0) {
    return absl::FailedPreconditionError(
        "ComputeUploaded: no batch was uploaded");
  }
  RETURN_IF_ERROR(LaunchForwardBackward(uploaded_batch_));
  return Sync();
}

absl::StatusOr<EvalResult> CudaBackendImpl::Evaluate(
    absl::Span<const float> x, absl::Span<const int32_t> labels) {
  RETURN_IF_ERROR(UseDevice());
  RETURN_IF_ERROR(CheckBackendInputs("Evaluate", layout_, weights_set_,
                                     /*max_batch=*/0, x, labels));
  const int64_t n = static_cast<int64_t>(labels.size());
  const int C = layout_.num_classes();

  const int L = layout_.num_layers();
  const int64_t P = layout_.num_params();
  float* row_loss = grad_.get() + P;
  const float* h_row_loss = h_grad_.get() + P;
  EvalResult result;
  for (int64_t start = 0; start < n; start += max_batch_) {
    const int B = static_cast<int>(std::min<int64_t>(max_batch_, n - start));
    RETURN_IF_ERROR(StageInputs(x.data() + start * layout_.input_dim(),
                                labels.data() + start, B));
    uploaded_batch_ = 0;  // x_ now holds evaluation data
    RETURN_IF_ERROR(EnqueueForward(B));
    CUDA_RETURN_IF_ERROR(LaunchEvalRows(act_[L - 1].get(), labels_.get(),
                                        row_loss, correct_.get(), B, C,
                                        stream_));
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h_grad_.get() + P, row_loss,
                                         B * sizeof(float),
                                         cudaMemcpyDeviceToHost, stream_));
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h_correct_.get(), correct_.get(),
                                         B * sizeof(int32_t),
                                         cudaMemcpyDeviceToHost, stream_));
    RETURN_IF_ERROR(Sync());
    for (int i = 0; i < B; ++i) {
      result.correct += h_correct_.get()[i];
      result.loss_sum += static_cast<double>(h_row_loss[i]);
    }
  }
  result.count = n;
  return result;
}

// The module's entry object (cuda_module.h) over the functions below.
class CudaModuleImpl final : public CudaModule {
 public:
  absl::StatusOr<int> DeviceCount() override { return CudaDeviceCount(); }
  absl::StatusOr<GpuInfo> OpenDevice(int device) override {
    return OpenCudaDevice(device);
  }
  absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(
      const ModelLayout& layout, const BackendOptions& options) override {
    ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend,
                     CudaBackend::Create(layout, options));
    return std::unique_ptr<Backend>(std::move(backend));
  }
  std::string Architectures() override { return CudaArchitectures(); }
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(
    const ModelLayout& layout, const BackendOptions& options,
    const CudaOptions& cuda_options) {
  if (options.max_batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda backend: max_batch must be >= 1, got ", options.max_batch));
  }
  auto backend =
      std::make_unique<CudaBackendImpl>(layout, options, cuda_options);
  RETURN_IF_ERROR(backend->Init());
  return std::unique_ptr<CudaBackend>(std::move(backend));
}

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error == cudaSuccess && count > 0) return count;
  cudaGetLastError();  // clear it, so that later calls do not report it
  const std::string code = error == cudaSuccess
                               ? ""
                               : absl::StrCat(": ", cudaGetErrorName(error),
                                              ": ", cudaGetErrorString(error));
  if (error == cudaErrorInsufficientDriver) {
    int runtime = 0;
    cudaRuntimeGetVersion(&runtime);
    return absl::FailedPreconditionError(absl::StrCat(
        "no CUDA driver, or one too old for CUDA ", runtime / 1000, ".",
        runtime % 1000 / 10, " (CUDA 13 needs driver R580 or newer)", code));
  }
  if (error == cudaSuccess || error == cudaErrorNoDevice) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device is visible",
                     visible != nullptr
                         ? absl::StrCat(" (CUDA_VISIBLE_DEVICES=", visible, ")")
                         : "",
                     code));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("no usable CUDA driver or device", code));
}

absl::StatusOr<GpuInfo> OpenCudaDevice(int device) {
  ASSIGN_OR_RETURN(const int count, CudaDeviceCount());
  if (device < 0 || device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", device, " does not exist: ", count,
                     " device", count == 1 ? " is" : "s are", " visible"));
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  cudaDeviceProp prop;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device));
  GpuInfo info;
  info.device = device;
  info.device_count = count;
  info.name = prop.name;
  info.memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  if (const cudaError_t error = CheckKernelImage(); error != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("this build has no kernel image for ", info.name,
                     " (compute capability ", info.cc_major, ".", info.cc_minor,
                     "): it holds ", CudaArchitectures(), " (",
                     cudaGetErrorName(error), ")"));
  }
  return info;
}

std::string CudaArchitectures() {
  // DP_CUDA_ARCHITECTURES is CMake's list: "75-real;...;120-virtual".
  std::vector<std::string> real, ptx;
  for (absl::string_view arch :
       absl::StrSplit(DP_CUDA_ARCHITECTURES, ';', absl::SkipEmpty())) {
    // "N-real": code only; "N-virtual": PTX only; "N": both.
    const bool is_virtual = absl::ConsumeSuffix(&arch, "-virtual");
    const bool is_real = absl::ConsumeSuffix(&arch, "-real");
    if (!is_virtual) real.push_back(absl::StrCat("sm_", arch));
    if (!is_real) ptx.push_back(absl::StrCat("compute_", arch));
  }
  return absl::StrCat(absl::StrJoin(real, " "), ", PTX ",
                      ptx.empty() ? "none" : absl::StrJoin(ptx, " "));
}

}  // namespace dp

extern "C" {
__attribute__((visibility("default"))) const char* dp_cuda_module_abi() {
  return DP_CUDA_MODULE_ABI;
}
__attribute__((visibility("default"))) dp::CudaModule* dp_cuda_module_v1() {
  static auto* module = new dp::CudaModuleImpl();
  return module;
}
}
