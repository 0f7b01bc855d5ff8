// What the forward+backward benchmarks (backend_bench, gpu_bench) share: the
// flags that pick batch sizes and repetitions, the synthetic batch, the
// model's multiply-adds and the timing loop. Numbers only; nothing asserts on
// time.
#ifndef DP_BENCH_STEP_BENCH_H_
#define DP_BENCH_STEP_BENCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "common/flags.h"
#include "common/model_layout.h"

namespace dp {

struct StepBenchOptions {
  std::string batches;  // comma-separated batch sizes
  int repeats = 7;
  int iters = 50;
};

// Adds --batches, --repeats and --iters to `flags`, with `options` as the
// defaults.
void AddStepBenchFlags(Flags* flags, StepBenchOptions* options);

// Parses argv into `flags`; on --help, --version or a bad value (batch sizes,
// repeats and iterations must be positive integers) exits with the flags'
// conventions (0, or kExitConfigError naming the problem). Returns the batch
// sizes.
std::vector<int> ParseStepBenchFlags(Flags* flags, int argc, char** argv,
                                     const StepBenchOptions& options);

// A fixed random batch of up to max_batch samples (inputs and labels).
struct BenchBatch {
  std::vector<float> x;
  std::vector<int32_t> labels;
};
BenchBatch RandomBatch(const ModelLayout& layout, int max_batch);

// Multiply-adds per sample of one forward+backward: forward X W^T, dW = dY^T
// X for every layer, and dX = dY W for every layer but the first.
int64_t MacsPerSample(const ModelLayout& layout);

struct StepTiming {
  double median_ms;  // wall time per step, median over repeats
  double min_ms;
  double median_cpu_ms;  // process CPU time per step (all threads)
};
// Warms up, then runs `repeats` times `iters` steps.
StepTiming TimeSteps(const StepBenchOptions& options,
                     absl::FunctionRef<void()> step);

// Prints "<program>: <status>" to stderr and exits 1 when s is not OK.
void ExitIfError(const char* program, const absl::Status& s);

}  // namespace dp

#endif  // DP_BENCH_STEP_BENCH_H_
