// The fused kernels of the CUDA backend, each next to its launcher, and their
// host-memory test entry points. Each kernel mirrors a loop of
// worker/cpu_backend.cc (the definition); reductions run in a fixed order
// (no floating-point atomics), so results are bitwise reproducible.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "worker/cuda_kernels.cuh"
#include "worker/cuda_kernels_testing.h"

namespace dp {

absl::Status CudaErrorStatus(cudaError_t error, const char* expr,
                             const char* file, int line) {
  std::string message =
      absl::StrCat(file, ":", line, ": ", expr, ": ", cudaGetErrorName(error),
                   ": ", cudaGetErrorString(error));
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorInvalidDeviceFunction:
    case cudaErrorDevicesUnavailable:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

namespace {

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 8;  // warps per block of the row kernels
constexpr int kElementwiseThreads = 256;
constexpr int kMaxElementwiseBlocks = 4096;

// Launches kernel<<<grid, block, 0, stream>>>(args...) and returns the error
// of this launch. (cudaGetLastError after <<<>>> would also return an error
// left by any earlier call, and report it at the wrong file:line.)
template <typename... Params, typename... Args>
cudaError_t Launch(void (*kernel)(Params...), dim3 grid, dim3 block,
                   cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  return cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
}

int ElementwiseBlocks(int64_t n) {
  return static_cast<int>(std::min<int64_t>(
      std::max<int64_t>((n + kElementwiseThreads - 1) / kElementwiseThreads, 1),
      kMaxElementwiseBlocks));
}

// torch.relu (NaN passes: NaN < 0 is false).
__device__ __forceinline__ float Relu(float v) { return v < 0.0f ? 0.0f : v; }

// std::max(a, b) of the CPU reference: a unless a < b.
__device__ __forceinline__ float MaxLikeStd(float a, float b) {
  return a < b ? b : a;
}

// The grid-stride loop of the elementwise kernels: thread t of the grid takes
// elements t, t + GridThreads(), t + 2 GridThreads(), ...
__device__ __forceinline__ int64_t GridThread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t GridThreads() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// ---------------------------------------------------------------------------
// Bias + ReLU forward. y is (B,out); element i has column i % out.
template <bool kRelu>
__global__ void BiasReluKernel(float* __restrict__ y,
                               const float* __restrict__ bias, int64_t n,
                               int out) {
  for (int64_t i = GridThread(); i < n; i += GridThreads()) {
    const float v = y[i] + bias[i % out];
    y[i] = kRelu ? Relu(v) : v;
  }
}

// The same over float4: out % 4 == 0 and both pointers 16-byte aligned.
// n4 = B*out/4 vectors, out4 = out/4 vectors per row.
template <bool kRelu>
__global__ void BiasReluKernel4(float4* __restrict__ y,
                                const float4* __restrict__ bias, int64_t n4,
                                int out4) {
  for (int64_t i = GridThread(); i < n4; i += GridThreads()) {
    float4 v = y[i];
    const float4 b = bias[i % out4];
    v.x += b.x;
    v.y += b.y;
    v.z += b.z;
    v.w += b.w;
    if (kRelu) {
      v.x = Relu(v.x);
      v.y = Relu(v.y);
      v.z = Relu(v.z);
      v.w = Relu(v.w);
    }
    y[i] = v;
  }
}

}  // namespace

cudaError_t LaunchBiasRelu(float* y, const float* bias, int B, int out,
                           bool relu, cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(B) * out;
  if (n == 0) return cudaSuccess;
  const bool vec = out % 4 == 0 &&
                   reinterpret_cast<uintptr_t>(y) % alignof(float4) == 0 &&
                   reinterpret_cast<uintptr_t>(bias) % alignof(float4) == 0;
  if (vec) {
    const int64_t n4 = n / 4;
    float4* y4 = reinterpret_cast<float4*>(y);
    const float4* b4 = reinterpret_cast<const float4*>(bias);
    return Launch(relu ? BiasReluKernel4<true> : BiasReluKernel4<false>,
                  ElementwiseBlocks(n4), kElementwiseThreads, stream, y4, b4,
                  n4, out / 4);
  }
  return Launch(relu ? BiasReluKernel<true> : BiasReluKernel<false>,
                ElementwiseBlocks(n), kElementwiseThreads, stream, y, bias, n,
                out);
}

namespace {

// ---------------------------------------------------------------------------
// Row statistics shared by the loss kernels: one warp holds row z (C), lane
// l the columns l, l+32, ... Every lane ends with the same m = max_j z_j and
// s = sum_j exp(z_j - m): the xor butterfly adds a+b on one lane and b+a on
// its partner, which are the same float.
struct RowStats {
  float max;
  float sum;
};

__device__ __forceinline__ RowStats WarpRowStats(const float* __restrict__ z,
                                                 int C, int lane) {
  float m = -INFINITY;
  for (int j = lane; j < C; j += kWarp) m = MaxLikeStd(m, z[j]);
  for (int o = kWarp / 2; o > 0; o /= 2) {
    m = MaxLikeStd(m, __shfl_xor_sync(0xffffffffu, m, o));
  }
  float s = 0.0f;
  for (int j = lane; j < C; j += kWarp) s += expf(z[j] - m);
  for (int o = kWarp / 2; o > 0; o /= 2) {
    s += __shfl_xor_sync(0xffffffffu, s, o);
  }
  return {m, s};
}

// logits, dlogits (B,C); labels, row_loss (B). One warp per row.
__global__ void SoftmaxCrossEntropyKernel(const float* __restrict__ logits,
                                          const int32_t* __restrict__ labels,
                                          float* __restrict__ dlogits,
                                          float* __restrict__ row_loss, int B,
                                          int C, float inv_b) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= B) return;  // uniform per warp
  const float* z = logits + static_cast<int64_t>(row) * C;
  float* dz = dlogits + static_cast<int64_t>(row) * C;
  const int label = labels[row];
  const RowStats r = WarpRowStats(z, C, lane);
  if (lane == 0) row_loss[row] = (r.max + logf(r.sum)) - z[label];
  const float scale = inv_b / r.sum;
  for (int j = lane; j < C; j += kWarp) {
    float d = expf(z[j] - r.max) * scale;
    if (j == label) d -= inv_b;
    dz[j] = d;
  }
}

}  // namespace

cudaError_t LaunchSoftmaxCrossEntropy(const float* logits,
                                      const int32_t* labels, float* dlogits,
                                      float* row_loss, int B, int C,
                                      cudaStream_t stream) {
  if (B == 0) return cudaSuccess;
  const int blocks = (B + kRowsPerBlock - 1) / kRowsPerBlock;
  const float inv_b = 1.0f / static_cast<float>(B);
  return Launch(SoftmaxCrossEntropyKernel, blocks, kRowsPerBlock * kWarp,
                stream, logits, labels, dlogits, row_loss, B, C, inv_b);
}

namespace {

// ---------------------------------------------------------------------------
// Column sums, optionally fused with ReLU backward. Block (32, 8) owns 32
// columns of one chunk of kColumnSumChunkRows rows: thread (tx, ty) adds rows
// r0+ty, r0+ty+8, ... of column tx in order, then ty = 0 adds the 8 partial
// sums in ty order. With one chunk that is the result; otherwise each chunk's
// sum goes to partials (chunks, out) and the last block of the column tile
// to arrive adds them in chunk order. Which block is last varies; the order
// of the additions does not. The tile counters are zeroed before every such
// launch, in the same stream, so an aborted launch or a replayed graph
// cannot leave them counting from anything but zero.
constexpr int kColumnSumRowsPerPass = 8;

template <bool kMask>
__global__ void ColumnSumsKernel(float* __restrict__ dy,
                                 const float* __restrict__ act,
                                 float* __restrict__ db, int B, int out,
                                 float* __restrict__ partials,
                                 unsigned* __restrict__ counters) {
  __shared__ float part[kColumnSumRowsPerPass][kColumnSumTile + 1];
  __shared__ bool is_last;
  const int tx = threadIdx.x;
  const int ty = threadIdx.y;
  const int c = blockIdx.x * kColumnSumTile + tx;
  const int chunk = blockIdx.y;
  const int r0 = chunk * kColumnSumChunkRows;
  const int r1 = min(B, r0 + kColumnSumChunkRows);
  float acc = 0.0f;
  if (c < out) {
    for (int r = r0 + ty; r < r1; r += kColumnSumRowsPerPass) {
      const int64_t i = static_cast<int64_t>(r) * out + c;
      float v = dy[i];
      if (kMask) {
        v = act[i] <= 0.0f ? 0.0f : v;
        dy[i] = v;
      }
      acc += v;
    }
  }
  part[ty][tx] = acc;
  __syncthreads();
  float sum = 0.0f;
  if (ty == 0) {
    sum = part[0][tx];
    for (int k = 1; k < kColumnSumRowsPerPass; ++k) sum += part[k][tx];
  }
  if (gridDim.y == 1) {  // uniform: one chunk, no second stage
    if (ty == 0 && c < out) db[c] = sum;
    return;
  }
  if (ty == 0 && c < out) partials[static_cast<int64_t>(chunk) * out + c] = sum;
  __threadfence();
  __syncthreads();
  if (tx == 0 && ty == 0) {
    const unsigned ticket = atomicAdd(&counters[blockIdx.x], 1u);
    is_last = ticket == gridDim.y - 1;
  }
  __syncthreads();
  if (!is_last) return;
  if (ty == 0 && c < out) {
    float total = __ldcg(&partials[c]);
    for (int k = 1; k < static_cast<int>(gridDim.y); ++k) {
      total += __ldcg(&partials[static_cast<int64_t>(k) * out + c]);
    }
    db[c] = total;
  }
}

}  // namespace

cudaError_t LaunchColumnSums(float* dy, const float* act, float* db, int B,
                             int out, float* partials, unsigned* counters,
                             cudaStream_t stream) {
  if (out == 0) return cudaSuccess;
  if (B == 0) return cudaMemsetAsync(db, 0, sizeof(float) * out, stream);
  const dim3 grid(ColumnSumTiles(out), ColumnSumChunks(B));
  const dim3 block(kColumnSumTile, kColumnSumRowsPerPass);
  if (grid.y > 1) {
    const cudaError_t zeroed = cudaMemsetAsync(
        counters, 0, sizeof(unsigned) * ColumnSumTiles(out), stream);
    if (zeroed != cudaSuccess) return zeroed;
  }
  return Launch(
      act != nullptr ? ColumnSumsKernel<true> : ColumnSumsKernel<false>, grid,
      block, stream, dy, act, db, B, out, partials, counters);
}

namespace {

// ---------------------------------------------------------------------------
// Evaluation rows: loss as SoftmaxCrossEntropyKernel, argmax as the CPU's
// sequential loop (arg = 0; arg = j when z[j] > z[arg]) decides it: the
// lowest index wins ties, a NaN never wins, and a NaN in column 0 wins
// (nothing compares greater than it). Lanes skip NaNs, the warp reduces the
// rest, and column 0's NaN is applied last. One warp per row.
__global__ void EvalRowsKernel(const float* __restrict__ logits,
                               const int32_t* __restrict__ labels,
                               float* __restrict__ row_loss,
                               int32_t* __restrict__ correct, int B, int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= B) return;  // uniform per warp
  const float* z = logits + static_cast<int64_t>(row) * C;
  const int label = labels[row];
  float best = 0.0f;
  int arg = -1;  // -1: this lane has no column
  for (int j = lane; j < C; j += kWarp) {
    if (isnan(z[j])) continue;
    if (arg < 0 || z[j] > best) {
      best = z[j];
      arg = j;
    }
  }
  for (int o = kWarp / 2; o > 0; o /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, best, o);
    const int other_arg = __shfl_xor_sync(0xffffffffu, arg, o);
    const bool take = other_arg >= 0 && (arg < 0 || other > best ||
                                         (other == best && other_arg < arg));
    if (take) {
      best = other;
      arg = other_arg;
    }
  }
  const RowStats r = WarpRowStats(z, C, lane);
  if (lane == 0) {
    if (arg < 0 || isnan(z[0])) arg = 0;
    row_loss[row] = (r.max + logf(r.sum)) - z[label];
    correct[row] = arg == label ? 1 : 0;
  }
}

__global__ void ProbeKernel() {}

}  // namespace

cudaError_t LaunchEvalRows(const float* logits, const int32_t* labels,
                           float* row_loss, int32_t* correct, int B, int C,
                           cudaStream_t stream) {
  if (B == 0) return cudaSuccess;
  const int blocks = (B + kRowsPerBlock - 1) / kRowsPerBlock;
  return Launch(EvalRowsKernel, blocks, kRowsPerBlock * kWarp, stream, logits,
                labels, row_loss, correct, B, C);
}

cudaError_t CheckKernelImage() {
  cudaFuncAttributes attributes;
  return cudaFuncGetAttributes(&attributes, ProbeKernel);
}

// ---------------------------------------------------------------------------
// Host-memory test entry points.
namespace {

// Copies host (n) to a new device buffer; with copy false, only allocates.
template <typename T>
absl::Status ToDevice(absl::Span<const T> host, size_t n, bool copy,
                      DevicePtr<T>* out) {
  void* p = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
  out->reset(static_cast<T*>(p));
  if (copy && n > 0) {
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy(p, host.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status ToHost(const DevicePtr<T>& device, absl::Span<T> host) {
  if (host.empty()) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(cudaMemcpy(host.data(), device.get(),
                                  host.size() * sizeof(T),
                                  cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

absl::Status CheckSize(const char* what, size_t got, int64_t want) {
  if (static_cast<int64_t>(got) == want) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, " has ", got, " elements, expected ", want));
}

}  // namespace

absl::Status CudaBiasReluForTest(absl::Span<float> y,
                                 absl::Span<const float> bias, int B, int out,
                                 bool relu) {
  const int64_t n = static_cast<int64_t>(B) * out;
  RETURN_IF_ERROR(CheckSize("y", y.size(), n));
  RETURN_IF_ERROR(CheckSize("bias", bias.size(), out));
  DevicePtr<float> dy, db;
  RETURN_IF_ERROR(ToDevice<float>(y, n, true, &dy));
  RETURN_IF_ERROR(ToDevice<float>(bias, out, true, &db));
  CUDA_RETURN_IF_ERROR(LaunchBiasRelu(dy.get(), db.get(), B, out, relu, 0));
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return ToHost(dy, y);
}

absl::Status CudaSoftmaxCrossEntropyForTest(absl::Span<const float> logits,
                                            absl::Span<const int32_t> labels,
                                            int B, int C,
                                            absl::Span<float> dlogits,
                                            absl::Span<float> row_loss) {
  const int64_t n = static_cast<int64_t>(B) * C;
  RETURN_IF_ERROR(CheckSize("logits", logits.size(), n));
  RETURN_IF_ERROR(CheckSize("labels", labels.size(), B));
  RETURN_IF_ERROR(CheckSize("dlogits", dlogits.size(), n));
  RETURN_IF_ERROR(CheckSize("row_loss", row_loss.size(), B));
  DevicePtr<float> dz, ddz, dloss;
  DevicePtr<int32_t> dlabels;
  RETURN_IF_ERROR(ToDevice<float>(logits, n, true, &dz));
  RETURN_IF_ERROR(ToDevice<int32_t>(labels, B, true, &dlabels));
  RETURN_IF_ERROR(ToDevice<float>({}, n, false, &ddz));
  RETURN_IF_ERROR(ToDevice<float>({}, B, false, &dloss));
  CUDA_RETURN_IF_ERROR(LaunchSoftmaxCrossEntropy(
      dz.get(), dlabels.get(), ddz.get(), dloss.get(), B, C, 0));
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  RETURN_IF_ERROR(ToHost(ddz, dlogits));
  return ToHost(dloss, row_loss);
}

absl::Status CudaColumnSumsForTest(absl::Span<float> dy,
                                   absl::Span<const float> act, int B, int out,
                                   absl::Span<float> db) {
  const int64_t n = static_cast<int64_t>(B) * out;
  RETURN_IF_ERROR(CheckSize("dy", dy.size(), n));
  if (!act.empty()) RETURN_IF_ERROR(CheckSize("act", act.size(), n));
  RETURN_IF_ERROR(CheckSize("db", db.size(), out));
  DevicePtr<float> ddy, dact, ddb, partials;
  DevicePtr<unsigned> counters;
  RETURN_IF_ERROR(ToDevice<float>(dy, n, true, &ddy));
  if (!act.empty()) RETURN_IF_ERROR(ToDevice<float>(act, n, true, &dact));
  RETURN_IF_ERROR(ToDevice<float>({}, out, false, &ddb));
  RETURN_IF_ERROR(ToDevice<float>(
      {}, static_cast<size_t>(ColumnSumChunks(B)) * out, false, &partials));
  RETURN_IF_ERROR(
      ToDevice<unsigned>({}, ColumnSumTiles(out), false, &counters));
  // Scratch of any contents must do: as a graph replay or an aborted launch
  // could leave it.
  CUDA_RETURN_IF_ERROR(
      cudaMemset(counters.get(), 0xab,
                 sizeof(unsigned) * std::max(ColumnSumTiles(out), 1)));
  CUDA_RETURN_IF_ERROR(LaunchColumnSums(ddy.get(), dact.get(), ddb.get(), B,
                                        out, partials.get(), counters.get(),
                                        0));
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  RETURN_IF_ERROR(ToHost(ddy, dy));
  return ToHost(ddb, db);
}

absl::Status CudaEvalRowsForTest(absl::Span<const float> logits,
                                 absl::Span<const int32_t> labels, int B, int C,
                                 absl::Span<float> row_loss,
                                 absl::Span<int32_t> correct) {
  const int64_t n = static_cast<int64_t>(B) * C;
  RETURN_IF_ERROR(CheckSize("logits", logits.size(), n));
  RETURN_IF_ERROR(CheckSize("labels", labels.size(), B));
  RETURN_IF_ERROR(CheckSize("row_loss", row_loss.size(), B));
  RETURN_IF_ERROR(CheckSize("correct", correct.size(), B));
  DevicePtr<float> dz, dloss;
  DevicePtr<int32_t> dlabels, dcorrect;
  RETURN_IF_ERROR(ToDevice<float>(logits, n, true, &dz));
  RETURN_IF_ERROR(ToDevice<int32_t>(labels, B, true, &dlabels));
  RETURN_IF_ERROR(ToDevice<float>({}, B, false, &dloss));
  RETURN_IF_ERROR(ToDevice<int32_t>({}, B, false, &dcorrect));
  CUDA_RETURN_IF_ERROR(LaunchEvalRows(dz.get(), dlabels.get(), dloss.get(),
                                      dcorrect.get(), B, C, 0));
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  RETURN_IF_ERROR(ToHost(dloss, row_loss));
  return ToHost(dcorrect, correct);
}

}  // namespace dp
