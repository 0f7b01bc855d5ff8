// Forward+backward time of the CPU backend on SimpleNet: median and min over
// repeats, per batch size. Prints numbers; never asserts on time.
//   backend_bench [--batches=64,512] [--repeats=7] [--iters=50] [--threads=1]
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include "bench/step_bench.h"
#include "common/flags.h"
#include "common/model_layout.h"
#include "worker/backend.h"
#include "worker/backend_choice.h"

int main(int argc, char** argv) {
  dp::StepBenchOptions options;
  options.batches = "64,512";
  int threads = 1;
  dp::Flags flags("backend_bench",
                  "Forward+backward time of the CPU backend on SimpleNet.");
  dp::AddStepBenchFlags(&flags, &options);
  flags.AddInt("threads", &threads, "BLAS threads");
  const std::vector<int> batches =
      dp::ParseStepBenchFlags(&flags, argc, argv, options);

  const dp::ModelLayout layout = dp::ModelLayout::SimpleNet();
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  dp::BackendOptions backend_options;
  backend_options.max_batch = max_batch;
  backend_options.cpu_threads = threads;
  auto backend = dp::CreateBackend("cpu", layout, backend_options);
  dp::ExitIfError("backend_bench", backend.status());
  dp::ExitIfError("backend_bench",
                  (*backend)->SetWeights(dp::InitParams(layout, 1)));
  const dp::BenchBatch batch_data = dp::RandomBatch(layout, max_batch);
  std::vector<float> grad(layout.num_params());

  std::printf(
      "CPU backend, SimpleNet 784-256-128-10, %d BLAS thread(s), "
      "%d repeats x %d iterations\n",
      threads, options.repeats, options.iters);
  std::printf("%8s %12s %12s %14s %10s\n", "batch", "median ms", "min ms",
              "median cpu ms", "GFLOP/s");
  for (int batch : batches) {
    absl::Span<const float> xs(batch_data.x.data(),
                               static_cast<size_t>(batch) * layout.input_dim());
    absl::Span<const int32_t> ls(batch_data.labels.data(), batch);
    const dp::StepTiming t = dp::TimeSteps(options, [&] {
      dp::ExitIfError(
          "backend_bench",
          (*backend)->ForwardBackward(xs, ls, absl::MakeSpan(grad)).status());
    });
    const double gflops =
        2.0 * dp::MacsPerSample(layout) * batch / (t.median_ms * 1e6);
    std::printf("%8d %12.3f %12.3f %14.3f %10.1f\n", batch, t.median_ms,
                t.min_ms, t.median_cpu_ms, gflops);
  }
  return 0;
}
