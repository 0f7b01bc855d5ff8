// Forward+backward time of the CPU backend on SimpleNet: median and min over
// repeats, per batch size. Prints numbers; never asserts on time.
//   backend_bench [--batches=64,512] [--repeats=7] [--iters=50] [--threads=1]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/model_layout.h"
#include "common/random.h"
#include "worker/backend.h"

namespace {

struct Args {
  std::vector<int> batches = {64, 512};
  int repeats = 7;
  int iters = 50;
  int threads = 1;
};

// CPU time of the whole process (all BLAS threads), in ms: on a busy machine
// it is steadier than wall time, which also counts time spent descheduled.
double ProcessCpuMs() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

bool ParseInt(absl::string_view s, int* out) {
  return absl::SimpleAtoi(s, out) && *out > 0;
}

bool Parse(int argc, char** argv, Args* args) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view a = argv[i];
    std::vector<std::string> kv = absl::StrSplit(a, absl::MaxSplits('=', 1));
    if (kv.size() != 2) return false;
    if (kv[0] == "--batches") {
      args->batches.clear();
      for (absl::string_view b : absl::StrSplit(kv[1], ',')) {
        int v;
        if (!ParseInt(b, &v)) return false;
        args->batches.push_back(v);
      }
    } else if (kv[0] == "--repeats") {
      if (!ParseInt(kv[1], &args->repeats)) return false;
    } else if (kv[0] == "--iters") {
      if (!ParseInt(kv[1], &args->iters)) return false;
    } else if (kv[0] == "--threads") {
      if (!ParseInt(kv[1], &args->threads)) return false;
    } else {
      return false;
    }
  }
  return !args->batches.empty();
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (!Parse(argc, argv, &args)) {
    std::fprintf(stderr,
                 "usage: %s [--batches=64,512] [--repeats=7] [--iters=50] "
                 "[--threads=1]\n",
                 argv[0]);
    return 2;
  }
  const dp::ModelLayout layout = dp::ModelLayout::SimpleNet();
  const int max_batch =
      *std::max_element(args.batches.begin(), args.batches.end());
  dp::BackendOptions options;
  options.max_batch = max_batch;
  options.cpu_threads = args.threads;
  auto backend = dp::CreateBackend("cpu", layout, options);
  if (!backend.ok()) {
    std::fprintf(stderr, "%s\n", backend.status().ToString().c_str());
    return 1;
  }
  if (!(*backend)->SetWeights(dp::InitParams(layout, 1)).ok()) return 1;

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
    const int64_t w = layout.weight(l).size;
    macs_per_sample += (l == 0 ? 2 : 3) * w;
  }

  std::printf(
      "CPU backend, SimpleNet 784-256-128-10, %d BLAS thread(s), "
      "%d repeats x %d iterations\n",
      args.threads, args.repeats, args.iters);
  std::printf("%8s %12s %12s %14s %10s\n", "batch", "median ms", "min ms",
              "median cpu ms", "GFLOP/s");
  for (int batch : args.batches) {
    const size_t nx = static_cast<size_t>(batch) * layout.input_dim();
    absl::Span<const float> xs(x.data(), nx);
    absl::Span<const int32_t> ls(labels.data(), batch);
    float sink = 0.0f;
    auto step = [&] {
      auto loss = (*backend)->ForwardBackward(xs, ls, absl::MakeSpan(grad));
      if (!loss.ok()) {
        std::fprintf(stderr, "%s\n", loss.status().ToString().c_str());
        std::exit(1);
      }
      sink += *loss;
    };
    for (int i = 0; i < std::max(5, args.iters / 5); ++i) step();  // warm-up
    std::vector<double> ms, cpu_ms;
    for (int r = 0; r < args.repeats; ++r) {
      const double c0 = ProcessCpuMs();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < args.iters; ++i) step();
      const auto t1 = std::chrono::steady_clock::now();
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count() /
                   args.iters);
      cpu_ms.push_back((ProcessCpuMs() - c0) / args.iters);
    }
    std::sort(ms.begin(), ms.end());
    std::sort(cpu_ms.begin(), cpu_ms.end());
    const double median = ms[ms.size() / 2];
    const double gflops = 2.0 * macs_per_sample * batch / (median * 1e6);
    std::printf("%8d %12.3f %12.3f %14.3f %10.1f\n", batch, median, ms.front(),
                cpu_ms[cpu_ms.size() / 2], gflops);
    if (sink != sink) std::printf("(loss was NaN)\n");
  }
  return 0;
}
