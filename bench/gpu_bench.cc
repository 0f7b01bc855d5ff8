// Forward+backward time of the CUDA backend on SimpleNet, per batch size:
// median and min over repeats, host timing after the device is done. Prints a
// table and optionally CSV rows (impl,mode,batch,median_ms,min_ms) that
// scripts/gpu-check.sh sets against bench/torch_gpu_bench.py. Modes:
//   compute  batch already on the device, one CUDA graph per step (default)
//   eager    the same, every kernel and cuBLAS call launched one by one
//   step     ForwardBackward as a worker calls it: x from pageable host
//            memory to the device, gradient back into a host vector
// Never asserts on time.
//   gpu_bench [--batches=64,512,4096] [--repeats=7] [--iters=50] [--tf32]
//             [--csv=FILE]
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/step_bench.h"
#include "common/flags.h"
#include "common/model_layout.h"
#include "worker/backend.h"
#include "worker/cuda_backend.h"

namespace {

void Check(const absl::Status& s) { dp::ExitIfError("gpu_bench", s); }

}  // namespace

int main(int argc, char** argv) {
  dp::StepBenchOptions options;
  options.batches = "64,512,4096";
  bool tf32 = false;
  std::string csv_path;
  dp::Flags flags("gpu_bench",
                  "Forward+backward time of the CUDA backend on SimpleNet.");
  dp::AddStepBenchFlags(&flags, &options);
  flags.AddBool("tf32", &tf32, "TF32 tensor-core matrix products");
  flags.AddString("csv", &csv_path,
                  "also write impl,mode,batch,median_ms,min_ms rows here");
  const std::vector<int> batches =
      dp::ParseStepBenchFlags(&flags, argc, argv, options);
  if (absl::StatusOr<dp::GpuInfo> gpu = dp::OpenCudaDevice(0); !gpu.ok()) {
    std::fprintf(stderr, "gpu_bench: no usable GPU: %s\n",
                 std::string(gpu.status().message()).c_str());
    return 1;
  }
  const dp::ModelLayout layout = dp::ModelLayout::SimpleNet();
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  dp::BackendOptions backend_options;
  backend_options.max_batch = max_batch;
  backend_options.tf32 = tf32;
  dp::CudaOptions graphs_on, graphs_off;
  graphs_off.graphs = false;
  auto graphed = dp::CudaBackend::Create(layout, backend_options, graphs_on);
  Check(graphed.status());
  auto eager = dp::CudaBackend::Create(layout, backend_options, graphs_off);
  Check(eager.status());
  const std::vector<float> params = dp::InitParams(layout, 1);
  Check((*graphed)->SetWeights(params));
  Check((*eager)->SetWeights(params));

  const dp::BenchBatch batch_data = dp::RandomBatch(layout, max_batch);
  std::vector<float> grad(layout.num_params());

  FILE* csv = nullptr;
  if (!csv_path.empty()) {
    csv = std::fopen(csv_path.c_str(), "w");
    if (csv == nullptr) {
      std::fprintf(stderr, "gpu_bench: cannot write %s\n", csv_path.c_str());
      return 1;
    }
    std::fprintf(csv, "impl,mode,batch,median_ms,min_ms\n");
  }
  std::printf("%s, SimpleNet 784-256-128-10, fp32%s, %d repeats x %d steps\n",
              (*graphed)->Name().c_str(), tf32 ? " (TF32 on)" : "",
              options.repeats, options.iters);
  std::printf("%8s %-8s %11s %11s %12s %9s\n", "batch", "mode", "median ms",
              "min ms", "samples/s", "TFLOP/s");
  for (int batch : batches) {
    absl::Span<const float> xs(batch_data.x.data(),
                               static_cast<size_t>(batch) * layout.input_dim());
    absl::Span<const int32_t> ls(batch_data.labels.data(), batch);
    Check((*graphed)->UploadBatch(xs, ls));
    Check((*eager)->UploadBatch(xs, ls));
    struct Mode {
      const char* name;
      std::function<void()> step;
    };
    const Mode modes[] = {
        {"compute", [&] { Check((*graphed)->ComputeUploaded()); }},
        {"eager", [&] { Check((*eager)->ComputeUploaded()); }},
        {"step",
         [&] {
           Check((*graphed)
                     ->ForwardBackward(xs, ls, absl::MakeSpan(grad))
                     .status());
         }},
    };
    for (const Mode& mode : modes) {
      const dp::StepTiming t = dp::TimeSteps(options, mode.step);
      const double tflops =
          2.0 * dp::MacsPerSample(layout) * batch / (t.median_ms * 1e-3) / 1e12;
      std::printf("%8d %-8s %11.4f %11.4f %12.0f %9.2f\n", batch, mode.name,
                  t.median_ms, t.min_ms, batch / (t.median_ms * 1e-3), tflops);
      if (csv != nullptr) {
        std::fprintf(csv, "dp,%s,%d,%.6f,%.6f\n", mode.name, batch, t.median_ms,
                     t.min_ms);
      }
    }
  }
  if (csv != nullptr) std::fclose(csv);
  return 0;
}
