// Gradient averaging fused with one torch.optim.Adam step.
#ifndef DP_SERVER_ADAM_H_
#define DP_SERVER_ADAM_H_

#include <cstdint>

#include "absl/types/span.h"
#include "common/job_config.h"
#include "common/parallel_for.h"
#include "common/tensor_codec.h"

namespace dp {

// Averages `grads` (each n floats) in the order given - rank order, so the
// result never depends on arrival order - and applies Adam step `t` (1-based)
// of a job of `total_steps` to params, m and v (n floats each), exactly as
// torch.optim.Adam's (or AdamW's) single-tensor path (PyTorch 1.13, CPU),
// rounding for rounding, after clip_grad_norm_ and with the rate that
// LambdaLR gives update t - 1 (server/lr_schedule.h's ScheduledLr):
//   g = (grads[0] + grads[1] + ...) / N;  g = g * clip
//   Adam:  g = fma(p, weight_decay, g)     AdamW:  p = p * (1 - lr * wd)
//   m = fma(g, 1 - beta1, m * beta1)
//   v = fma((1 - beta2) * g, g, v * beta2)
//   p += (-lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// with the scalars computed in double and rounded to float, as torch does.
// clip is 1 unless clip_grad_norm > 0: then min(1, clip_grad_norm /
// (|g| + 1e-6)) in float, |g| the global L2 norm of the average, its
// squares summed in double in element order (a pass of its own, one
// thread), so it too is the same for any pool. Each buffer is otherwise
// read and written once.
// The largest gradient value dp-ps accepts. Within it the rank sum of up to
// 1024 gradients, its square and Adam's m, v and update all stay finite for
// any finite state, so finite inputs can never make the weights NaN or Inf.
// No gradient of a mean loss comes near it.
inline constexpr float kMaxAbsGradient = 1e15f;

// With a pool, the elements are split into one contiguous range per thread.
// Every element's arithmetic is the same whatever the split, so the result
// is bit-identical for any pool size, or none.
void AverageAndAdamStep(const AdamOptions& options, int64_t t,
                        int64_t total_steps,
                        absl::Span<const float* const> grads, int64_t n,
                        float* params, float* m, float* v,
                        WorkerPool* pool = nullptr);

// The rank sum built as gradients arrive, in rank order: DecodeChecked
// (common/tensor_codec.h) and the addition to the sum in one pass, for the
// gradient of the next rank to fold: out[i] = sum[i] + g[i] + kept[0][i]
// + kept[1][i] + ..., added in that order, for the n values g encoded (as
// `e`) in `bytes` and the gradients `kept` of the ranks after it that came
// before it (already checked). No sum (null): the sum starts with g, as for
// rank 0. Each value of `bytes` is read once - they may be a worker's
// shared-memory slot, rewritten meanwhile - and checked as DecodeChecked
// does. Returns -1 when every value is finite and within `limit` in
// magnitude; otherwise the index of the first that is not, and out[index] is
// then that value as read (the rest of out means nothing). `sum` and `kept`
// are never written, so a refused gradient leaves them as they were. The
// same additions, in the same order, as AverageAndAdamStep's sum (decoding,
// then adding g and each kept gradient in turn): bit-identical, with a pool
// or not.
int64_t AddEncodedToSum(Encoding e, const char* bytes, int64_t n, float limit,
                        const float* sum, absl::Span<const float* const> kept,
                        float* out, WorkerPool* pool = nullptr);
// Where an update also writes the weights it makes, encoded (Encode of
// the updated params): the workers' copy in shared memory, written in the
// update's own pass while each block is in L1 - the pass is bound by its
// divisions, so the copy costs next to nothing there, against a pass of
// its own over the weights afterwards. Null `out`: no copy.
struct EncodedCopy {
  char* out = nullptr;  // n values of `encoding`
  Encoding encoding = Encoding::kF32;
};

// AverageAndAdamStep on a sum of `count` gradients (AddEncodedToSum; the
// micro-batch tree's root, of K micro-batches): the same bits as
// AverageAndAdamStep on the gradients themselves, and the updated params
// encoded into `copy`.
void AdamStepOnSum(const AdamOptions& options, int64_t t, int64_t total_steps,
                   const float* sum, int count, int64_t n, float* params,
                   float* m, float* v, WorkerPool* pool = nullptr,
                   EncodedCopy copy = {});

}  // namespace dp

#endif  // DP_SERVER_ADAM_H_
