// Shared parts of the forward+backward benchmarks.
#include "bench/step_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/random.h"

namespace dp {
namespace {

// CPU time of the whole process (all BLAS threads), in ms: on a busy machine
// it is steadier than wall time, which also counts time spent descheduled.
double ProcessCpuMs() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

[[noreturn]] void ConfigError(const std::string& message) {
  std::fprintf(stderr, "%s\n", message.c_str());
  std::exit(kExitConfigError);
}

}  // namespace

void AddStepBenchFlags(Flags* flags, StepBenchOptions* options) {
  flags->AddString("batches", &options->batches,
                   "comma-separated batch sizes to time");
  flags->AddInt("repeats", &options->repeats,
                "timed repeats per batch size (the median is reported)");
  flags->AddInt("iters", &options->iters, "steps per repeat");
}

std::vector<int> ParseStepBenchFlags(Flags* flags, int argc, char** argv,
                                     const StepBenchOptions& options) {
  auto action = flags->Parse(argc, argv);
  if (!action.ok()) ConfigError(std::string(action.status().message()));
  if (*action == Flags::Action::kExit) std::exit(kExitOk);
  if (options.repeats < 1 || options.iters < 1) {
    ConfigError("--repeats and --iters must be >= 1");
  }
  std::vector<int> batches;
  for (absl::string_view b : absl::StrSplit(options.batches, ',')) {
    int v;
    if (!absl::SimpleAtoi(b, &v) || v < 1) {
      ConfigError(
          "--batches must be positive integers separated by commas, "
          "got '" +
          options.batches + "'");
    }
    batches.push_back(v);
  }
  return batches;
}

BenchBatch RandomBatch(const ModelLayout& layout, int max_batch) {
  Rng rng(2, 0);
  BenchBatch b;
  b.x.resize(static_cast<size_t>(max_batch) * layout.input_dim());
  for (float& v : b.x) v = static_cast<float>(rng.Normal());
  b.labels.resize(max_batch);
  for (int32_t& l : b.labels) l = static_cast<int32_t>(rng.Below(10));
  return b;
}

int64_t MacsPerSample(const ModelLayout& layout) {
  int64_t macs = 0;
  for (int l = 0; l < layout.num_layers(); ++l) {
    macs += (l == 0 ? 2 : 3) * layout.weight(l).size;
  }
  return macs;
}

StepTiming TimeSteps(const StepBenchOptions& options,
                     absl::FunctionRef<void()> step) {
  for (int i = 0; i < std::max(5, options.iters / 5); ++i) step();  // warm-up
  std::vector<double> ms, cpu_ms;
  for (int r = 0; r < options.repeats; ++r) {
    const double c0 = ProcessCpuMs();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < options.iters; ++i) step();
    const auto t1 = std::chrono::steady_clock::now();
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count() /
                 options.iters);
    cpu_ms.push_back((ProcessCpuMs() - c0) / options.iters);
  }
  std::sort(ms.begin(), ms.end());
  std::sort(cpu_ms.begin(), cpu_ms.end());
  return {ms[ms.size() / 2], ms.front(), cpu_ms[cpu_ms.size() / 2]};
}

void ExitIfError(const char* program, const absl::Status& s) {
  if (s.ok()) return;
  std::fprintf(stderr, "%s: %s\n", program, s.ToString().c_str());
  std::exit(1);
}

}  // namespace dp
