// The coordinator tests' job, setup and calls (tests/coordinator_harness.h).
#include "tests/coordinator_harness.h"

#include <cmath>

#include "gtest/gtest.h"

namespace dp {

JobConfig TestJob(int world, int micro_batches, int min_workers) {
  JobConfig c;
  c.schedule.world_size = world;
  c.schedule.micro_batches = micro_batches;
  c.schedule.batch_size = 4;
  c.schedule.epochs = 1;
  c.dataset = "synthetic";
  c.min_workers = min_workers;
  return c;
}

std::unique_ptr<StepCoordinator> MakeTestCoordinator(
    const ModelLayout& layout, const CoordinatorSetup& setup) {
  const ShardSpec shard = setup.shard.OrWhole(layout.num_params());
  const std::vector<float> all = InitParams(layout, setup.init_seed);
  TrainingState s;
  s.params.assign(all.begin() + shard.range.offset,
                  all.begin() + shard.range.end());
  auto c = std::make_unique<StepCoordinator>(layout, setup.job, std::move(s),
                                             setup.update_threads, shard);
  if (setup.elastic.has_value()) c->SetElastic(*setup.elastic);
  const int registered =
      setup.registered >= 0 ? setup.registered : setup.job.schedule.world_size;
  for (int r = 0; r < registered; ++r) {
    auto admitted = RegisterRank(*c, r, setup.data);
    EXPECT_TRUE(admitted.ok()) << "rank " << r << ": " << admitted.status();
  }
  return c;
}

absl::StatusOr<StepCoordinator::Registration> RegisterRank(
    StepCoordinator& c, int rank, const DataFingerprint& data,
    absl::string_view worker_id) {
  return c.Register(rank, c.layout().Fingerprint(), data, worker_id);
}

std::string WireBytes(absl::Span<const float> values, Encoding e) {
  std::string bytes(values.size() * BytesPerValue(e), '\0');
  Encode(e, values.data(), values.size(), bytes.data());
  return bytes;
}

std::vector<float> AsRead(absl::Span<const float> values, Encoding e) {
  std::vector<float> read(values.size());
  Decode(e, WireBytes(values, e).data(), values.size(), read.data());
  return read;
}

std::vector<float> TestGradient(const ModelLayout& layout, int rank,
                                int64_t step) {
  std::vector<float> g(layout.num_params());
  for (int64_t i = 0; i < layout.num_params(); ++i) {
    const float scale = rank == 0 ? 1e8f : 1.0f;
    g[i] = scale * std::sin(0.37f * i + rank * 1.3f + step * 0.11f) + rank;
  }
  return g;
}

absl::StatusOr<StepCoordinator::PushResult> PushGradient(StepCoordinator& c,
                                                         int rank, int64_t step,
                                                         Encoding e) {
  const ParamRange range = c.shard().range;
  const std::vector<float> g = TestGradient(c.layout(), rank, step);
  return c.Push(
      rank, step, range.offset,
      WireBytes(absl::MakeConstSpan(g).subspan(range.offset, range.length), e),
      1.0f, e);
}

void PushStep(StepCoordinator& c, int64_t step, Encoding e) {
  const int world = c.Status().config.schedule.world_size;
  for (int r = 0; r < world; ++r) {
    auto pushed = PushGradient(c, r, step, e);
    EXPECT_TRUE(pushed.ok())
        << "rank " << r << ", step " << step << ": " << pushed.status();
  }
}

std::vector<Block> SumBlocks(const StepCoordinator::ObservableState& o) {
  std::vector<Block> blocks;
  for (const auto& [block, values] : o.sums) blocks.push_back(block);
  return blocks;
}

std::vector<float> PulledValues(const StepCoordinator::PulledWeights& w) {
  std::vector<float> out(w.bytes.size() / BytesPerValue(w.encoding));
  Decode(w.encoding, w.bytes.data(), out.size(), out.data());
  return out;
}

}  // namespace dp
