// order_dump: prints dp-ps's data order, its micro-batch tree's blocks and
// tree sums for given arguments, one fact a line, so that the Python port
// (python/dp_ps: data_order, micro_batch_tree) is compared with the C++ to
// the bit (tests/python/order_test.py prints the same lines).
//   order_dump SEED NUM_SAMPLES BATCH_SIZE MICRO_BATCHES EPOCHS SHUFFLE
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/data_order.h"
#include "common/micro_batch_tree.h"
#include "common/random.h"

namespace {

// The steps whose micro-batches are printed: both ends of each epoch.
std::vector<int64_t> StepsToPrint(const dp::Schedule& s) {
  std::vector<int64_t> steps;
  for (int64_t e = 0; e < s.epochs; ++e) {
    steps.push_back(e * s.steps_per_epoch());
    steps.push_back(e * s.steps_per_epoch() + 1);
    steps.push_back((e + 1) * s.steps_per_epoch() - 1);
  }
  return steps;
}

void PrintIndices(const dp::Schedule& s) {
  dp::BatchSampler sampler(s);
  for (int64_t step : StepsToPrint(s)) {
    if (step >= s.total_steps()) continue;
    for (int j = 0; j < s.num_micro_batches(); ++j) {
      std::printf("indices %lld %d", static_cast<long long>(step), j);
      for (int32_t i : sampler.Indices(step, j)) std::printf(" %d", i);
      std::printf("\n");
    }
  }
}

// Leaves of a tree sum: values of many magnitudes, so that another order
// of the additions would round differently.
void PrintTreeSums(uint64_t seed) {
  constexpr int kValues = 8;
  for (int count = 1; count <= 9; ++count) {
    dp::Rng rng(seed, 1000 + count);
    std::vector<std::vector<float>> leaves(count, std::vector<float>(kValues));
    std::vector<float*> pointers;
    for (int m = 0; m < count; ++m) {
      for (int i = 0; i < kValues; ++i) {
        const double scale = 1.0 / (1 + (m * kValues + i) % 7 * 1000.0);
        leaves[m][i] = static_cast<float>((2.0 * rng.Uniform() - 1.0) * scale);
      }
      pointers.push_back(leaves[m].data());
    }
    std::vector<float> out(kValues);
    dp::SumInTreeOrder(pointers, kValues, out.data());
    std::printf("tree %d", count);
    for (float v : out) {
      uint32_t bits;
      std::memcpy(&bits, &v, sizeof(bits));
      std::printf(" %08x", bits);
    }
    std::printf("\n");
  }
}

void PrintSplits() {
  for (int k = 1; k <= 12; ++k) {
    for (int w = 1; w <= k + 1; ++w) {
      std::printf("split %d %d", k, w);
      for (const dp::Block& b : dp::SplitForWorkers(k, w)) {
        std::printf(" %d:%d", b.first, b.count);
      }
      std::printf("\n");
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr,
                 "usage: %s SEED NUM_SAMPLES BATCH_SIZE MICRO_BATCHES EPOCHS "
                 "SHUFFLE\n",
                 argv[0]);
    return 2;
  }
  dp::Schedule s;
  s.seed = std::strtoull(argv[1], nullptr, 10);
  s.num_samples = std::atoll(argv[2]);
  s.batch_size = std::atoi(argv[3]);
  s.micro_batches = std::atoi(argv[4]);
  s.world_size = s.micro_batches;
  s.epochs = std::atoi(argv[5]);
  s.shuffle = std::atoi(argv[6]) != 0;
  if (absl::Status valid = dp::ValidateSchedule(s); !valid.ok()) {
    std::fprintf(stderr, "%s\n", std::string(valid.message()).c_str());
    return 2;
  }
  std::printf("steps %lld %lld\n", static_cast<long long>(s.steps_per_epoch()),
              static_cast<long long>(s.total_steps()));
  PrintIndices(s);
  PrintSplits();
  PrintTreeSums(s.seed);
  return 0;
}
