// The fused kernels of the CUDA backend (each defined next to its launcher in
// cuda_kernels.cu) and the CUDA-error-to-absl::Status helper. For .cu files
// only; the CPU definition of every operation is worker/cpu_backend.cc.
// Shapes: B = batch, row-major, weights are (out, in).
#ifndef DP_WORKER_CUDA_KERNELS_CUH_
#define DP_WORKER_CUDA_KERNELS_CUH_

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"

namespace dp {

// "worker/cuda_backend.cu:42: cudaMalloc(&p, n): cudaErrorMemoryAllocation:
// out of memory", with the most specific absl code for the CUDA error.
absl::Status CudaErrorStatus(cudaError_t error, const char* expr,
                             const char* file, int line);

#define CUDA_RETURN_IF_ERROR(expr)                                             \
  do {                                                                         \
    const cudaError_t dp_cuda_error_ = (expr);                                 \
    if (dp_cuda_error_ != cudaSuccess) {                                       \
      return ::dp::CudaErrorStatus(dp_cuda_error_, #expr, __FILE__, __LINE__); \
    }                                                                          \
  } while (0)

// Device and pinned host memory owned by a unique_ptr.
struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};
struct CudaFreeHost {
  void operator()(void* p) const { cudaFreeHost(p); }
};
template <typename T>
using DevicePtr = std::unique_ptr<T, CudaFree>;
template <typename T>
using PinnedPtr = std::unique_ptr<T, CudaFreeHost>;

// Rows per chunk of the column-sum kernels: the reduction order of a column
// sum depends on B only, never on scheduling.
constexpr int kColumnSumChunkRows = 128;
constexpr int kColumnSumTile = 32;  // columns per block

// Sizes of the scratch buffers ColumnSums needs for (B, out) inputs.
inline int ColumnSumChunks(int B) {
  return (B + kColumnSumChunkRows - 1) / kColumnSumChunkRows;
}
inline int ColumnSumTiles(int out) {
  return (out + kColumnSumTile - 1) / kColumnSumTile;
}

// y (B,out) += bias (out), then ReLU in place when relu is set (torch.relu:
// NaN passes through).
cudaError_t LaunchBiasRelu(float* y, const float* bias, int B, int out,
                           bool relu, cudaStream_t stream);

// logits (B,C), labels (B) -> dlogits (B,C) = (softmax - onehot) / B and
// row_loss (B) = logsumexp(logits_i) - logits_i[label_i], numerically stable
// (max subtracted). One warp per row. Labels must be in [0, C).
cudaError_t LaunchSoftmaxCrossEntropy(const float* logits,
                                      const int32_t* labels, float* dlogits,
                                      float* row_loss, int B, int C,
                                      cudaStream_t stream);

// db (out) = column sums of dy (B,out). When act (B,out) is not null, first
// applies ReLU backward in place: dy = act <= 0 ? 0 : dy (torch's
// threshold_backward on the ReLU output). Deterministic: each block sums a
// fixed chunk of rows for 32 columns in row order; the last block of each
// column tile (found with an integer atomic counter) adds the chunk partials
// in chunk order. partials holds ColumnSumChunks(B) * out floats; counters
// ColumnSumTiles(out) unsigned ints of scratch (any contents).
cudaError_t LaunchColumnSums(float* dy, const float* act, float* db, int B,
                             int out, float* partials, unsigned* counters,
                             cudaStream_t stream);

// Evaluation of logits (B,C): row_loss (B) as in LaunchSoftmaxCrossEntropy,
// correct (B) = 1 where argmax == label, else 0, with the argmax of the CPU
// loop: lowest index on ties, NaN never wins except in column 0.
cudaError_t LaunchEvalRows(const float* logits, const int32_t* labels,
                           float* row_loss, int32_t* correct, int B, int C,
                           cudaStream_t stream);

// cudaSuccess when this build has a kernel image the current device can run.
cudaError_t CheckKernelImage();

}  // namespace dp

#endif  // DP_WORKER_CUDA_KERNELS_CUH_
