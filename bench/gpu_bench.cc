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
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/model_layout.h"
#include "common/random.h"
#include "worker/backend.h"
#include "worker/cuda_backend.h"

namespace {

struct Args {
  std::vector<int> batches = {64, 512, 4096};
  int repeats = 7;
  int iters = 50;
  bool tf32 = false;
  std::string csv;
};

bool ParsePositive(absl::string_view s, int* out) {
  return absl::SimpleAtoi(s, out) && *out > 0;
}

bool Parse(int argc, char** argv, Args* args) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view a = argv[i];
    if (a == "--tf32") {
      args->tf32 = true;
      continue;
    }
    std::vector<std::string> kv = absl::StrSplit(a, absl::MaxSplits('=', 1));
    if (kv.size() != 2) return false;
    if (kv[0] == "--batches") {
      args->batches.clear();
      for (absl::string_view b : absl::StrSplit(kv[1], ',')) {
        int v;
        if (!ParsePositive(b, &v)) return false;
        args->batches.push_back(v);
      }
    } else if (kv[0] == "--repeats") {
      if (!ParsePositive(kv[1], &args->repeats)) return false;
    } else if (kv[0] == "--iters") {
      if (!ParsePositive(kv[1], &args->iters)) return false;
    } else if (kv[0] == "--csv") {
      args->csv = kv[1];
    } else {
      return false;
    }
  }
  return !args->batches.empty();
}

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "gpu_bench: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

struct Timing {
  double median_ms;
  double min_ms;
};

// Runs step iters times per repeat, after a warm-up; ms per step.
Timing Time(const Args& args, const std::function<void()>& step) {
  for (int i = 0; i < std::max(5, args.iters / 5); ++i) step();
  std::vector<double> ms;
  for (int r = 0; r < args.repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < args.iters; ++i) step();
    const auto t1 = std::chrono::steady_clock::now();
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count() /
                 args.iters);
  }
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front()};
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (!Parse(argc, argv, &args)) {
    std::fprintf(stderr,
                 "usage: %s [--batches=64,512,4096] [--repeats=7] "
                 "[--iters=50] [--tf32] [--csv=FILE]\n",
                 argv[0]);
    return 2;
  }
  std::string why;
  if (!dp::CudaDeviceAvailable(&why)) {
    std::fprintf(stderr, "gpu_bench: no usable GPU: %s\n", why.c_str());
    return 1;
  }
  const dp::ModelLayout layout = dp::ModelLayout::SimpleNet();
  const int max_batch =
      *std::max_element(args.batches.begin(), args.batches.end());
  dp::BackendOptions options;
  options.max_batch = max_batch;
  options.tf32 = args.tf32;
  dp::CudaOptions graphs_on, graphs_off;
  graphs_off.graphs = false;
  auto graphed = dp::CudaBackend::Create(layout, options, graphs_on);
  Check(graphed.status());
  auto eager = dp::CudaBackend::Create(layout, options, graphs_off);
  Check(eager.status());
  const std::vector<float> params = dp::InitParams(layout, 1);
  Check((*graphed)->SetWeights(params));
  Check((*eager)->SetWeights(params));

  dp::Rng rng(2, 0);
  std::vector<float> x(static_cast<size_t>(max_batch) * layout.input_dim());
  for (float& v : x) v = static_cast<float>(rng.Normal());
  std::vector<int32_t> labels(max_batch);
  for (int32_t& l : labels) l = static_cast<int32_t>(rng.Below(10));
  std::vector<float> grad(layout.num_params());

  // Multiply-adds of one step: forward X W^T, dW = dY^T X, and dX = dY W for
  // every layer but the first.
  int64_t macs_per_sample = 0;
  for (int l = 0; l < layout.num_layers(); ++l) {
    macs_per_sample += (l == 0 ? 2 : 3) * layout.weight(l).size;
  }

  FILE* csv = nullptr;
  if (!args.csv.empty()) {
    csv = std::fopen(args.csv.c_str(), "w");
    if (csv == nullptr) {
      std::fprintf(stderr, "gpu_bench: cannot write %s\n", args.csv.c_str());
      return 1;
    }
    std::fprintf(csv, "impl,mode,batch,median_ms,min_ms\n");
  }
  std::printf("%s, SimpleNet 784-256-128-10, fp32%s, %d repeats x %d steps\n",
              (*graphed)->Name().c_str(), args.tf32 ? " (TF32 on)" : "",
              args.repeats, args.iters);
  std::printf("%8s %-8s %11s %11s %12s %9s\n", "batch", "mode", "median ms",
              "min ms", "samples/s", "TFLOP/s");
  for (int batch : args.batches) {
    absl::Span<const float> xs(x.data(),
                               static_cast<size_t>(batch) * layout.input_dim());
    absl::Span<const int32_t> ls(labels.data(), batch);
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
      const Timing t = Time(args, mode.step);
      const double tflops =
          2.0 * macs_per_sample * batch / (t.median_ms * 1e-3) / 1e12;
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
