// The metrics flags of the real dp-ps and dp-worker binaries: off by default,
// any free port with -1, a busy port is a clear error (exit 1), a bad port a
// configuration error (exit 2), IPv4 and IPv6 served by default.
#include <signal.h>
#include <unistd.h>

#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/flags.h"
#include "gtest/gtest.h"
#include "tests/exposition.h"
#include "tests/job_runner.h"
#include "tests/loopback_listener.h"
#include "tests/subprocess.h"

namespace dp {
namespace {

const absl::Duration kTimeout = absl::Seconds(60);

// Holds a loopback port with a plain listening socket.
class BusyPort {
 public:
  BusyPort() {
    fd_ = ListenOnLoopback(&port_, /*backlog=*/1);
    if (fd_ < 0) ADD_FAILURE() << "cannot hold a loopback port";
  }
  ~BusyPort() {
    if (fd_ >= 0) close(fd_);
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// The port in the "metrics on HOST:PORT" line, 0 if absent.
int MetricsPort(const Subprocess& p, const std::string& host) {
  int port = 0;
  auto field = p.Field("metrics on " + host + ":");
  if (field.has_value() && !absl::SimpleAtoi(*field, &port)) port = 0;
  return port;
}

TEST(MetricsJobTest, BusyMetricsPortIsExitOneNamingTheAddress) {
  BusyPort busy;
  ASSERT_GT(busy.port(), 0);
  const std::string address = absl::StrCat("127.0.0.1:", busy.port());
  const std::vector<std::vector<std::string>> commands = {
      {DP_PS_BINARY, "--host=127.0.0.1", "--port=0",
       absl::StrCat("--metrics_port=", busy.port()),
       "--metrics_host=127.0.0.1"},
      {DP_WORKER_BINARY, "--rank=0", "--ps=127.0.0.1:1",
       absl::StrCat("--metrics_port=", busy.port()),
       "--metrics_host=127.0.0.1"}};
  for (const auto& argv : commands) {
    Subprocess p(argv);
    EXPECT_EQ(p.Wait(kTimeout), kExitFailure) << p.output();
    EXPECT_NE(p.output().find("cannot serve metrics on " + address),
              std::string::npos)
        << p.output();
    EXPECT_NE(p.output().find("in use"), std::string::npos) << p.output();
    // A clean exit, not an abort from an uncaught exception.
    EXPECT_EQ(p.output().find("terminate called"), std::string::npos)
        << p.output();
  }
}

TEST(MetricsJobTest, MetricsPortOutOfRangeIsAConfigurationError) {
  Subprocess ps({DP_PS_BINARY, "--metrics_port=-2"});
  EXPECT_EQ(ps.Wait(kTimeout), kExitConfigError);
  EXPECT_NE(ps.output().find("--metrics_port"), std::string::npos)
      << ps.output();
  Subprocess w({DP_WORKER_BINARY, "--rank=0", "--metrics_port=70000"});
  EXPECT_EQ(w.Wait(kTimeout), kExitConfigError);
  EXPECT_NE(w.output().find("--metrics_port"), std::string::npos) << w.output();
}

TEST(MetricsJobTest, MetricsAreOffByDefaultAndAnyFreePortServesThem) {
  Subprocess off({DP_PS_BINARY, "--host=127.0.0.1", "--port=0"});
  ASSERT_TRUE(off.WaitForOutput("listening on", kTimeout)) << off.output();
  EXPECT_EQ(off.output().find("metrics on"), std::string::npos) << off.output();
  off.Signal(SIGTERM);
  EXPECT_EQ(off.Wait(kTimeout), kExitInterrupted);

  Subprocess on({DP_PS_BINARY, "--host=127.0.0.1", "--port=0",
                 "--metrics_port=-1", "--metrics_host=127.0.0.1", "--workers=3",
                 "--min_workers=2"});
  ASSERT_TRUE(on.WaitForOutput("listening on", kTimeout)) << on.output();
  const int port = MetricsPort(on, "127.0.0.1");
  ASSERT_GT(port, 0) << on.output();
  auto body = HttpGet("127.0.0.1", port, "/metrics");
  ASSERT_TRUE(body.ok()) << body.status();
  auto s = ParseExposition(*body);
  EXPECT_EQ(
      Sample(s, "dp_ps_expected_workers", {{"role", "ps"}, {"shard", "0"}}), 3);
  EXPECT_EQ(Sample(s, "dp_ps_min_workers", {{"role", "ps"}, {"shard", "0"}}),
            2);
  EXPECT_EQ(
      Sample(s, "dp_ps_registered_workers", {{"role", "ps"}, {"shard", "0"}}),
      0);
  on.Signal(SIGTERM);
  EXPECT_EQ(on.Wait(kTimeout), kExitInterrupted);
}

TEST(MetricsJobTest, EverySeriesOfAShardCarriesItsIndex) {
  // Shard 1 needs no --shard_addresses (only shard 0 collects the model).
  Subprocess ps({DP_PS_BINARY, "--host=127.0.0.1", "--port=0",
                 "--metrics_port=-1", "--metrics_host=127.0.0.1", "--workers=2",
                 "--shards=2", "--shard=1"});
  ASSERT_TRUE(ps.WaitForOutput("listening on", kTimeout)) << ps.output();
  const int port = MetricsPort(ps, "127.0.0.1");
  ASSERT_GT(port, 0) << ps.output();
  auto body = HttpGet("127.0.0.1", port, "/metrics");
  ASSERT_TRUE(body.ok()) << body.status();
  auto s = ParseExposition(*body);
  ASSERT_FALSE(s.empty()) << *body;
  for (const auto& [series, value] : s) {
    // prometheus-cpp's own exposer_* series describe the endpoint, not dp-ps.
    if (!absl::StartsWith(series, "dp_")) continue;
    EXPECT_NE(series.find("shard=\"1\""), std::string::npos) << series;
  }
  EXPECT_EQ(
      Sample(s, "dp_ps_expected_workers", {{"role", "ps"}, {"shard", "1"}}), 2);
  ps.Signal(SIGTERM);
  EXPECT_EQ(ps.Wait(kTimeout), kExitInterrupted);
}

// dp-ps exits 1 on a failed job, and a scraper that scrapes it regularly
// sees dp_training_failed 1 first: dp-ps waits for one more scrape (at most
// 1.5 intervals plus 1 s) before it exits. It tells the workers of the
// failure first, but not the killed one, whose connection closed: rank 0
// hears at its next call, long before a 15 s scrape interval is over.
TEST(MetricsJobTest, AFailedJobIsScrapedOnceMoreBeforeDpPsExits) {
  int port = 0;
  auto ps = StartServer({"--workers=2", "--max_steps=100000", "--batch_size=16",
                         "--worker_timeout_s=600", "--on_worker_loss=fail",
                         "--metrics_port=-1", "--metrics_host=127.0.0.1"},
                        &port);
  const int metrics = MetricsPort(*ps, "127.0.0.1");
  ASSERT_GT(metrics, 0) << ps->output();
  auto w0 = StartWorker(port, 0);
  auto w1 = StartWorker(port, 1);
  ASSERT_TRUE(WaitForStep(port, 5, kTimeout)) << ps->output();

  absl::Mutex mu;
  int scrapes = 0;
  std::vector<double> failed;  // dp_training_failed of every scrape
  std::thread scraper([&] {
    for (;;) {
      absl::StatusOr<std::string> text =
          HttpGet("127.0.0.1", metrics, "/metrics", absl::Seconds(5));
      if (!text.ok()) return;  // dp-ps is gone
      const auto v = Sample(ParseExposition(*text), "dp_training_failed",
                            {{"role", "ps"}, {"shard", "0"}});
      {
        absl::MutexLock lock(&mu);
        ++scrapes;
        failed.push_back(v.value_or(-1));
      }
      absl::SleepFor(absl::Milliseconds(500));  // the scrape interval
    }
  });
  {
    // dp-ps waits only for a scraper it has seen scrape twice.
    absl::MutexLock lock(&mu);
    auto twice = [&scrapes]() { return scrapes >= 2; };
    mu.Await(absl::Condition(&twice));
  }
  w1->Signal(SIGKILL);  // --on_worker_loss=fail: the job fails at once
  EXPECT_EQ(ps->Wait(kTimeout), kExitFailure) << ps->output();
  scraper.join();
  ASSERT_GE(failed.size(), 3u);
  EXPECT_EQ(failed.front(), 0);
  EXPECT_EQ(failed.back(), 1) << "the last scrape before dp-ps exited";
  EXPECT_NE(w0->Wait(kTimeout), 0);
}

// The exposition at host:port has dp_build_info.
void ExpectMetricsAt(const std::string& host, int port,
                     const Subprocess& from) {
  auto body = HttpGet(host, port, "/metrics");
  ASSERT_TRUE(body.ok()) << body.status() << "\n" << from.output();
  EXPECT_NE(body->find("dp_build_info"), std::string::npos) << *body;
}

// On an IPv6-only or IPv6-primary cluster Prometheus scrapes the pod's IPv6
// address: by default (--metrics_host=0.0.0.0, a wildcard) both binaries
// serve metrics on every IPv4 and IPv6 address, on one port.
TEST(MetricsJobTest, TheDefaultHostServesIpv4AndIpv6OnOnePort) {
  if (!HasIpv6Loopback()) GTEST_SKIP() << "no IPv6 loopback on this host";
  const std::vector<std::vector<std::string>> commands = {
      {DP_PS_BINARY, "--host=127.0.0.1", "--port=0", "--metrics_port=-1"},
      // --stop_timeout_s: a worker that never joined has no step to end;
      // the default 20 s would only be waited out.
      {DP_WORKER_BINARY, "--rank=0", "--ps=127.0.0.1:1", "--backend=cpu",
       "--retry_for_s=60", "--metrics_port=-1", "--stop_timeout_s=1"}};
  for (const auto& argv : commands) {
    Subprocess p(argv);
    ASSERT_TRUE(p.WaitForOutput("metrics on ", kTimeout)) << p.output();
    const int port = MetricsPort(p, "0.0.0.0");
    ASSERT_GT(port, 0) << p.output();
    ExpectMetricsAt("127.0.0.1", port, p);
    ExpectMetricsAt("::1", port, p);
    p.Signal(SIGTERM);
    EXPECT_EQ(p.Wait(kTimeout), kExitInterrupted) << p.output();
  }
}

TEST(MetricsJobTest, AnIpv6MetricsHostServesOnIt) {
  if (!HasIpv6Loopback()) GTEST_SKIP() << "no IPv6 loopback on this host";
  Subprocess ps({DP_PS_BINARY, "--host=127.0.0.1", "--port=0",
                 "--metrics_port=-1", "--metrics_host=::1"});
  ASSERT_TRUE(ps.WaitForOutput("listening on", kTimeout)) << ps.output();
  const int port = MetricsPort(ps, "::1");
  ASSERT_GT(port, 0) << ps.output();
  ExpectMetricsAt("::1", port, ps);
  ps.Signal(SIGTERM);
  EXPECT_EQ(ps.Wait(kTimeout), kExitInterrupted) << ps.output();
}

}  // namespace
}  // namespace dp
