// Shared memory between dp-ps and its workers: regions, the read-only
// weights, the one-time handover, and the sequence-locked weights.
#include "common/shared_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace dp {
namespace {

TEST(SharedMemoryTest, AReadOnlyDescriptorCannotBeMappedForWriting) {
  auto region = SharedRegion::Create("test", 4096);
  ASSERT_TRUE(region.ok()) << region.status();
  std::memset((*region)->data(), 7, 4096);
  absl::StatusOr<int> ro = (*region)->ReadOnlyDescriptor();
  ASSERT_TRUE(ro.ok()) << ro.status();
  void* w = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, *ro, 0);
  EXPECT_EQ(w, MAP_FAILED) << "a worker could write the weights";
  auto mapped = SharedRegion::Map(*ro, 4096, /*writable=*/false);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ((*mapped)->data()[4095], 7) << "the same memory";
}

TEST(SharedMemoryTest, ATicketHandsTheDescriptorsOverOnceAndOnlyOnce) {
  auto offer = SharedMemoryOffer::Start();
  ASSERT_TRUE(offer.ok()) << offer.status();
  auto region = SharedRegion::Create("test", 4096);
  ASSERT_TRUE(region.ok());
  (*region)->data()[0] = 42;
  const std::string ticket = (*offer)->Add({dup((*region)->fd())});
  auto fds = FetchSharedMemory((*offer)->socket_name(), ticket);
  ASSERT_TRUE(fds.ok()) << fds.status();
  ASSERT_EQ(fds->size(), 1u);
  auto mapped = SharedRegion::Map((*fds)[0], 4096, /*writable=*/true);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ((*mapped)->data()[0], 42);
  (*mapped)->data()[1] = 9;
  EXPECT_EQ((*region)->data()[1], 9) << "one memory for both sides";

  auto again = FetchSharedMemory((*offer)->socket_name(), ticket);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kPermissionDenied);
  std::string forged = ticket;
  forged[0] = forged[0] == 'a' ? 'b' : 'a';
  const std::string other = (*offer)->Add({dup((*region)->fd())});
  auto wrong = FetchSharedMemory((*offer)->socket_name(), forged);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kPermissionDenied);
  auto nowhere = FetchSharedMemory("dp-ps-no-such-socket", other);
  EXPECT_EQ(nowhere.status().code(), absl::StatusCode::kUnavailable);
}

TEST(SharedMemoryTest, ReadersSeeWholeVersionsWhileTheWriterPublishes) {
  const int64_t n = 50000;
  auto region =
      SharedRegion::Create("weights", WeightsRegionBytes(n, Encoding::kF32));
  ASSERT_TRUE(region.ok());
  // Version v holds the value v everywhere: a torn read shows two values.
  std::vector<float> values(n);
  auto publish = [&](int64_t v) {
    std::fill(values.begin(), values.end(), static_cast<float>(v));
    PublishWeights(region->get(), v, Encoding::kF32,
                   absl::string_view(reinterpret_cast<char*>(values.data()),
                                     n * sizeof(float)));
  };
  publish(0);
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (int64_t v = 1; v <= 2000; ++v) publish(v);
    done.store(true);
  });
  int reads = 0, torn = 0;
  std::vector<float> out(n);
  while (!done.load() || reads == 0) {
    absl::StatusOr<int64_t> version =
        ReadWeights(**region, absl::MakeSpan(out));
    if (!version.ok()) continue;  // rewritten throughout: asked again
    ++reads;
    for (float x : out) {
      if (x != static_cast<float>(*version)) {
        ++torn;
        break;
      }
    }
  }
  writer.join();
  EXPECT_GT(reads, 0);
  EXPECT_EQ(torn, 0) << "of " << reads << " reads";
  std::vector<float> more(n + 1);
  auto wrong_size = ReadWeights(**region, absl::MakeSpan(more));
  EXPECT_EQ(wrong_size.status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace dp
