// Host-memory entry points to each fused kernel of the CUDA backend, for the
// kernel-level parity tests (no CUDA headers here). Each call allocates device
// buffers, copies the inputs in, runs one kernel, copies the outputs back and
// frees everything: slow, and only for tests. Semantics as in cuda_kernels.cuh.
#ifndef DP_WORKER_CUDA_KERNELS_TESTING_H_
#define DP_WORKER_CUDA_KERNELS_TESTING_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace dp {

// y (B,out) in place.
absl::Status CudaBiasReluForTest(absl::Span<float> y,
                                 absl::Span<const float> bias, int B, int out,
                                 bool relu);

// logits (B,C), labels (B) -> dlogits (B,C), row_loss (B).
absl::Status CudaSoftmaxCrossEntropyForTest(absl::Span<const float> logits,
                                            absl::Span<const int32_t> labels,
                                            int B, int C,
                                            absl::Span<float> dlogits,
                                            absl::Span<float> row_loss);

// db (out) = column sums of dy (B,out); when act is not empty (B,out), dy is
// first masked in place by ReLU backward.
absl::Status CudaColumnSumsForTest(absl::Span<float> dy,
                                   absl::Span<const float> act, int B, int out,
                                   absl::Span<float> db);

// logits (B,C), labels (B) -> row_loss (B), correct (B).
absl::Status CudaEvalRowsForTest(absl::Span<const float> logits,
                                 absl::Span<const int32_t> labels, int B, int C,
                                 absl::Span<float> row_loss,
                                 absl::Span<int32_t> correct);

}  // namespace dp

#endif  // DP_WORKER_CUDA_KERNELS_TESTING_H_
