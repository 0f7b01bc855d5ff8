// What a worker that wakes dp-ps for nothing costs it: a forked process
// issues FUTEX_WAKE on its step channel's request word a million times
// while dp-ps's end of the page waits for a request, as in a job. Prints,
// for dp-ps's end with its idle backoff and without (the baseline), the
// median over the rounds of the waiting thread's CPU time for the flood,
// the wake-ups it saw and the backoffs it slept, and the CPU ratio. Asserts
// nothing.
// Usage: wake_flood_bench [wakes per round, default 1000000] [rounds, 5]
#include <linux/futex.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "common/shared_memory.h"
#include "common/step_channel.h"

namespace dp {
namespace {

double ThreadCpuMs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

struct Round {
  double server_cpu_ms = 0;
  double flood_ms = 0;  // the flood's wall time
  int64_t idle_wakes = 0;
  int64_t backoffs = 0;
};

Round Flood(int64_t wakes, absl::Duration backoff) {
  auto page = SharedRegion::Create("wake flood bench", kStepChannelBytes);
  if (!page.ok()) {
    std::fprintf(stderr, "%s\n", page.status().ToString().c_str());
    std::exit(1);
  }
  ChannelSpin spin;
  spin.idle_backoff = backoff;
  ChannelServer server(page->get(), spin);
  Round round;
  std::thread dp_ps([&] {
    const double start = ThreadCpuMs();
    ChannelRequest request;
    uint32_t seq = 0;
    server.Next(&request, &seq);  // until Stop()
    round.server_cpu_ms = ThreadCpuMs() - start;
  });
  // The hostile worker: another process with the page mapped.
  const absl::Time begin = absl::Now();
  const pid_t child = fork();
  if (child == 0) {
    auto* word = reinterpret_cast<uint32_t*>((*page)->data());
    for (int64_t i = 0; i < wakes; ++i) {
      syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
    }
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  round.flood_ms = absl::ToDoubleMilliseconds(absl::Now() - begin);
  server.Stop();
  dp_ps.join();
  round.idle_wakes = server.idle_wakes();
  round.backoffs = server.backoffs();
  return round;
}

template <typename F>
double Median(std::vector<Round> rounds, F f) {
  std::vector<double> v;
  for (const Round& r : rounds) v.push_back(f(r));
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace
}  // namespace dp

int main(int argc, char** argv) {
  int64_t wakes = 1'000'000;
  int rounds = 5;
  if ((argc > 1 && !absl::SimpleAtoi(argv[1], &wakes)) ||
      (argc > 2 && !absl::SimpleAtoi(argv[2], &rounds)) || wakes < 1 ||
      rounds < 1) {
    std::fprintf(stderr, "usage: wake_flood_bench [wakes] [rounds]\n");
    return 2;
  }
  std::vector<dp::Round> with, without;
  for (int i = 0; i < rounds; ++i) {  // interleaved: drift hits both alike
    with.push_back(dp::Flood(wakes, dp::ChannelSpin{}.idle_backoff));
    without.push_back(dp::Flood(wakes, absl::ZeroDuration()));
  }
  auto row = [&](const char* name, const std::vector<dp::Round>& r) {
    std::printf(
        "%-22s dp-ps CPU %8.1f ms  wake-ups seen %8.0f  backoffs %7.0f  "
        "flood %7.1f ms\n",
        name, dp::Median(r, [](auto& x) { return x.server_cpu_ms; }),
        dp::Median(r, [](auto& x) { return double(x.idle_wakes); }),
        dp::Median(r, [](auto& x) { return double(x.backoffs); }),
        dp::Median(r, [](auto& x) { return x.flood_ms; }));
  };
  std::printf("%lld wakes by another process, median of %d rounds\n",
              static_cast<long long>(wakes), rounds);
  row("with idle backoff", with);
  row("without (baseline)", without);
  const double ratio =
      dp::Median(with, [](auto& x) { return x.server_cpu_ms; }) /
      std::max(1e-3,
               dp::Median(without, [](auto& x) { return x.server_cpu_ms; }));
  std::printf("dp-ps CPU with backoff / without: %.3fx\n", ratio);
  return 0;
}
