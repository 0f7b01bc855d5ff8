// The metrics registry: Prometheus naming, bounded labels, the derived
// gauges, and the HTTP endpoint (free port, busy port, scrape hook).
#include "common/metrics.h"

#include <unistd.h>

#include <atomic>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "server/server_metrics.h"
#include "tests/exposition.h"
#include "tests/loopback_listener.h"
#include "worker/worker_metrics.h"

namespace dp {
namespace {

using Labels = std::map<std::string, std::string>;

ServerMetrics::Progress AtStep(int64_t step, int64_t planned) {
  ServerMetrics::Progress p;
  p.step = step;
  p.planned_steps = planned;
  p.epoch = 1;
  return p;
}

// "# TYPE name kind" lines of an exposition, name -> kind.
std::map<std::string, std::string> Types(const std::string& text) {
  std::map<std::string, std::string> types;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, "# TYPE ")) continue;
    std::vector<std::string> f = absl::StrSplit(line, ' ');
    if (f.size() == 4) types[f[2]] = f[3];
  }
  return types;
}

// Checks the conventions docs/monitoring.md promises.
void ExpectPrometheusNaming(const std::string& text) {
  const auto types = Types(text);
  ASSERT_FALSE(types.empty()) << text;
  for (const auto& [name, kind] : types) {
    EXPECT_TRUE(absl::StartsWith(name, "dp_")) << name;
    EXPECT_EQ(absl::EndsWith(name, "_total"), kind == "counter") << name;
    if (kind == "histogram") {
      EXPECT_TRUE(absl::EndsWith(name, "_seconds")) << name;
    }
  }
  const std::set<std::string> allowed = {"role",   "rank",    "shard",
                                         "reason", "version", "le"};
  for (const auto& [series, value] : ParseExposition(text)) {
    ASSERT_FALSE(absl::StartsWith(series, "!malformed")) << series;
    const size_t open = series.find('{');
    for (absl::string_view kv :
         absl::StrSplit(series.substr(open + 1, series.size() - open - 2), ',',
                        absl::SkipEmpty())) {
      const std::string label(kv.substr(0, kv.find('=')));
      EXPECT_TRUE(allowed.count(label))
          << "label " << label << " in " << series;
    }
    EXPECT_NE(series.find("role=\""), std::string::npos) << series;
  }
}

TEST(MetricsTest, WorkerAndServerFamiliesFollowPrometheusNaming) {
  WorkerMetrics worker(3);
  worker.ObserveCompute(absl::Milliseconds(5), 0.7);
  ExpectPrometheusNaming(worker.Text());
  ServerMetrics server(4);
  ServerMetrics::Progress p = AtStep(1, 10);
  p.has_loss = true;
  p.has_eval = true;
  server.SetProgress(p);
  ExpectPrometheusNaming(server.Text());
}

TEST(MetricsTest, WorkerSeriesCarryRoleAndRankAndCountWhatHappened) {
  WorkerMetrics m(1);
  const Labels w = {{"role", "worker"}, {"rank", "1"}};
  m.ObserveCompute(absl::Milliseconds(20), 0.5);
  m.ObserveCall(WorkerMetrics::Call::kPushPull, absl::Milliseconds(30));
  m.ObserveStep(absl::Milliseconds(60), 64);
  m.ObserveStep(absl::Milliseconds(40), 64);
  m.AddSentBytes(1000);
  m.AddReceivedBytes(2000);
  m.CountResync();
  m.CountCatchUp();
  m.CountCatchUp();
  auto s = ParseExposition(m.Text());
  EXPECT_EQ(Sample(s, "dp_worker_samples_total", w), 128);
  EXPECT_EQ(Sample(s, "dp_worker_step_duration_seconds_count", w), 2);
  EXPECT_DOUBLE_EQ(*Sample(s, "dp_worker_step_duration_seconds_sum", w), 0.1);
  EXPECT_EQ(Sample(s, "dp_worker_push_pull_duration_seconds_count", w), 1);
  EXPECT_EQ(Sample(s, "dp_worker_push_duration_seconds_count", w), 0);
  EXPECT_EQ(Sample(s, "dp_training_loss", w), 0.5);
  EXPECT_EQ(Sample(s, "dp_sent_bytes_total", w), 1000);
  EXPECT_EQ(Sample(s, "dp_received_bytes_total", w), 2000);
  EXPECT_EQ(Sample(s, "dp_worker_resyncs_total", w), 1);
  EXPECT_EQ(Sample(s, "dp_worker_catch_ups_total", w), 2);
  EXPECT_EQ(
      Sample(s, "dp_build_info",
             {{"role", "worker"}, {"rank", "1"}, {"version", DP_VERSION}}),
      1);
  // The 25 ms bucket holds the 20 ms compute, the 10 ms one does not.
  Labels le = w;
  le["le"] = "0.025";
  EXPECT_EQ(Sample(s, "dp_worker_compute_duration_seconds_bucket", le), 1);
  le["le"] = "0.01";
  EXPECT_EQ(Sample(s, "dp_worker_compute_duration_seconds_bucket", le), 0);
}

TEST(MetricsTest, EveryServerSeriesCarriesItsShardAndWorkerSeriesNone) {
  // The shards of a job are scraped under one job name: only this label
  // tells their update times and traffic apart.
  ServerMetrics server(2, /*shard=*/3);
  ServerMetrics::Progress p = AtStep(4, 10);
  p.has_loss = true;
  p.has_eval = true;
  server.SetProgress(p);
  server.ObserveUpdate(absl::Milliseconds(2));
  server.ObserveBarrierWait(1, absl::Milliseconds(3));
  server.AddReceivedBytes(100);
  server.AddSentBytes(200);
  const auto s = ParseExposition(server.Text());
  ASSERT_FALSE(s.empty());
  for (const auto& [series, value] : s) {
    EXPECT_NE(series.find("shard=\"3\""), std::string::npos) << series;
  }
  const Labels shard3 = {{"role", "ps"}, {"shard", "3"}};
  EXPECT_EQ(Sample(s, "dp_ps_update_duration_seconds_count", shard3), 1);
  EXPECT_EQ(Sample(s, "dp_received_bytes_total", shard3), 100);
  EXPECT_EQ(Sample(s, "dp_sent_bytes_total", shard3), 200);
  EXPECT_EQ(Sample(s, "dp_training_step", shard3), 4);
  EXPECT_EQ(Sample(s, "dp_build_info",
                   {{"role", "ps"}, {"shard", "3"}, {"version", DP_VERSION}}),
            1);
  // A dp-ps of one shard is shard 0.
  EXPECT_NE(ServerMetrics(2).Text().find("shard=\"0\""), std::string::npos);
  WorkerMetrics worker(1);
  worker.ObserveStep(absl::Milliseconds(10), 64);
  EXPECT_EQ(worker.Text().find("shard="), std::string::npos);
}

TEST(MetricsTest, LossAndTestAccuracyAppearOnlyOnceKnown) {
  // A 0 before the first value would read as "loss 0" or "0% accuracy".
  WorkerMetrics worker(0);
  EXPECT_FALSE(Sample(ParseExposition(worker.Text()), "dp_training_loss",
                      {{"role", "worker"}, {"rank", "0"}}));
  ServerMetrics server(2);
  const Labels ps = {{"role", "ps"}, {"shard", "0"}};
  server.SetProgress(AtStep(0, 10));
  auto s = ParseExposition(server.Text());
  EXPECT_FALSE(Sample(s, "dp_training_loss", ps));
  EXPECT_FALSE(Sample(s, "dp_test_accuracy", ps));
  EXPECT_EQ(Sample(s, "dp_training_planned_steps", ps), 10);
  ServerMetrics::Progress p = AtStep(5, 10);
  p.has_loss = true;
  p.loss = 0.25;
  p.has_eval = true;
  p.test_accuracy = 0.875;
  p.test_loss = 0.5;
  p.registered_workers = 2;
  server.SetProgress(p);
  s = ParseExposition(server.Text());
  EXPECT_EQ(Sample(s, "dp_training_loss", ps), 0.25);
  EXPECT_EQ(Sample(s, "dp_test_accuracy", ps), 0.875);
  EXPECT_EQ(Sample(s, "dp_test_loss", ps), 0.5);
  EXPECT_EQ(Sample(s, "dp_training_step", ps), 5);
  EXPECT_EQ(Sample(s, "dp_ps_registered_workers", ps), 2);
  EXPECT_EQ(Sample(s, "dp_ps_expected_workers", ps), 2);
}

TEST(MetricsTest, DataPlaneAppearsOnceTheWorkerKnowsIt) {
  // Before the worker has joined it has no plane: a 0 would read as "gRPC".
  WorkerMetrics m(3);
  const Labels w = {{"role", "worker"}, {"rank", "3"}};
  EXPECT_FALSE(Sample(ParseExposition(m.Text()), "dp_worker_shared_memory", w));
  m.SetSharedMemory(true);
  EXPECT_EQ(Sample(ParseExposition(m.Text()), "dp_worker_shared_memory", w), 1);
  // A re-join that lost shared memory (dp-ps restarted elsewhere) says so.
  m.SetSharedMemory(false);
  EXPECT_EQ(Sample(ParseExposition(m.Text()), "dp_worker_shared_memory", w), 0);
}

TEST(MetricsTest, MinWorkersIsTheJobsMinimumAndAtLeastOne) {
  const Labels ps = {{"role", "ps"}, {"shard", "0"}};
  ServerMetrics three(4, /*shard=*/0, /*min_workers=*/3);
  EXPECT_EQ(Sample(ParseExposition(three.Text()), "dp_ps_min_workers", ps), 3);
  // JobConfig's 0 counts as 1, as the coordinator reads it.
  ServerMetrics zero(4, /*shard=*/0, /*min_workers=*/0);
  EXPECT_EQ(Sample(ParseExposition(zero.Text()), "dp_ps_min_workers", ps), 1);
  ServerMetrics unset(4);
  EXPECT_EQ(Sample(ParseExposition(unset.Text()), "dp_ps_min_workers", ps), 1);
}

TEST(MetricsTest,
     RejectedReasonsAreStatusCodeNamesAndCancelledIsNotARejection) {
  ServerMetrics m(2);
  m.CountRejected(absl::StatusCode::kAborted);
  m.CountRejected(absl::StatusCode::kAborted);
  m.CountRejected(absl::StatusCode::kInvalidArgument);
  m.CountRejected(absl::StatusCode::kCancelled);
  m.CountRejected(absl::StatusCode::kOk);
  m.CountRejected(static_cast<absl::StatusCode>(1234));  // not a known code
  auto s = ParseExposition(m.Text());
  auto rejected = [&](const std::string& reason) {
    return Sample(s, "dp_ps_rejected_requests_total",
                  {{"role", "ps"}, {"shard", "0"}, {"reason", reason}});
  };
  EXPECT_EQ(rejected("aborted"), 2);
  EXPECT_EQ(rejected("invalid_argument"), 1);
  EXPECT_EQ(rejected("unknown"), 1);
  EXPECT_EQ(rejected("unavailable"), 0);  // present before it happens
  EXPECT_FALSE(rejected("cancelled"));
  EXPECT_FALSE(rejected("ok"));
  int reasons = 0;
  for (const auto& [series, v] : s) {
    reasons += absl::StartsWith(series, "dp_ps_rejected_requests_total{");
  }
  EXPECT_EQ(reasons, 15);  // the 17 status codes less OK and CANCELLED
}

TEST(MetricsTest, RanksOutsideTheJobCreateNoSeries) {
  ServerMetrics m(2);
  m.ObserveBarrierWait(1, absl::Milliseconds(3));
  m.ObserveBarrierWait(2, absl::Milliseconds(3));
  m.ObserveBarrierWait(-1, absl::Milliseconds(3));
  m.SawRank(1000000);
  m.SawRank(-5);
  const std::string text = m.Text();
  EXPECT_EQ(text.find("rank=\"2\""), std::string::npos) << text;
  EXPECT_EQ(text.find("rank=\"-1\""), std::string::npos) << text;
  auto s = ParseExposition(text);
  EXPECT_EQ(Sample(s, "dp_ps_barrier_wait_duration_seconds_count",
                   {{"role", "ps"}, {"shard", "0"}, {"rank", "1"}}),
            1);
  EXPECT_EQ(Sample(s, "dp_ps_barrier_wait_duration_seconds_count",
                   {{"role", "ps"}, {"shard", "0"}, {"rank", "0"}}),
            0);
  EXPECT_EQ(m.ActiveWorkers(), 0);
}

TEST(MetricsTest, ActiveWorkersAreRanksSeenWithinTheWindow) {
  absl::Time now = absl::FromUnixSeconds(1000);
  ServerMetrics m(3, /*shard=*/0, /*min_workers=*/1, absl::Seconds(60),
                  [&now] { return now; });
  EXPECT_EQ(m.ActiveWorkers(), 0);
  m.SawRank(0);
  now += absl::Seconds(30);
  m.SawRank(2);
  EXPECT_EQ(m.ActiveWorkers(), 2);
  now += absl::Seconds(31);  // rank 0 last seen 61 s ago
  EXPECT_EQ(m.ActiveWorkers(), 1);
  EXPECT_EQ(Sample(ParseExposition(m.Text()), "dp_ps_active_workers",
                   {{"role", "ps"}, {"shard", "0"}}),
            1);
  now += absl::Seconds(30);
  EXPECT_EQ(m.ActiveWorkers(), 0);
}

TEST(MetricsTest, AnyFreePortServesMetricsOverHttpAndRunsTheScrapeHook) {
  ServerMetrics m(2);
  std::atomic<int> hooks{0};
  auto endpoint = m.Serve("127.0.0.1", kMetricsAnyPort, [&] {
    ++hooks;
    m.SetProgress(AtStep(7, 9));
  });
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  ASSERT_GT(port, 0);
  auto body = HttpGet("127.0.0.1", port, "/metrics");
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_GE(hooks.load(), 1);
  auto s = ParseExposition(*body);
  EXPECT_EQ(Sample(s, "dp_training_step", {{"role", "ps"}, {"shard", "0"}}), 7);
  EXPECT_EQ(Sample(s, "dp_build_info",
                   {{"role", "ps"}, {"shard", "0"}, {"version", DP_VERSION}}),
            1);
  // Destroying the endpoint closes the port.
  endpoint->reset();
  EXPECT_FALSE(HttpGet("127.0.0.1", port, "/metrics").ok());
}

TEST(MetricsTest, AwaitNextScrapeWaitsOnlyForARegularScraper) {
  ServerMetrics m(2);
  auto endpoint = m.Serve("127.0.0.1", kMetricsAnyPort);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  // Nobody scrapes yet (Text() is no scrape): nothing to wait for.
  (void)m.Text();
  // The cap is far above every bound below, so that a wait that ran into
  // it is told from one that did not on any machine.
  const absl::Duration cap = absl::Minutes(5);
  const absl::Time t0 = absl::Now();
  EXPECT_FALSE(m.AwaitNextScrape(cap));
  EXPECT_LT(absl::Now() - t0, cap / 4);
  // Two scrapes 0.2 s apart: a regular scraper, the next one is awaited.
  ASSERT_TRUE(HttpGet("127.0.0.1", port, "/metrics").ok());
  absl::SleepFor(absl::Milliseconds(200));  // the scraper's interval
  ASSERT_TRUE(HttpGet("127.0.0.1", port, "/metrics").ok());
  std::atomic<bool> stop{false};
  std::thread scraper([&] {  // scrapes on, every 0.1 s
    while (!stop.load()) {
      (void)HttpGet("127.0.0.1", port, "/metrics");
      absl::SleepFor(absl::Milliseconds(100));
    }
  });
  EXPECT_TRUE(m.AwaitNextScrape(cap));
  stop = true;
  scraper.join();
  // No further scrape: the wait ends after 1.5 intervals + 1 s, not the cap.
  const absl::Time t1 = absl::Now();
  EXPECT_FALSE(m.AwaitNextScrape(cap));
  EXPECT_LT(absl::Now() - t1, cap / 4);
}

TEST(MetricsTest, BusyPortIsUnavailableNamingTheAddressAndDoesNotThrow) {
  // A plain listening socket holds the port.
  int port = 0;
  const int fd = ListenOnLoopback(&port, /*backlog=*/1);
  ASSERT_GE(fd, 0);

  WorkerMetrics m(0);
  auto endpoint = m.Serve("127.0.0.1", port);
  ASSERT_FALSE(endpoint.ok());
  EXPECT_EQ(endpoint.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(endpoint.status().message(),
                                absl::StrCat("127.0.0.1:", port)))
      << endpoint.status();
  EXPECT_TRUE(absl::StrContains(endpoint.status().message(), "in use"))
      << endpoint.status();
  close(fd);
}

TEST(MetricsTest, PortZeroIsOffAndOutOfRangePortsAreInvalid) {
  EXPECT_TRUE(ValidateMetricsPort(0).ok());
  EXPECT_TRUE(ValidateMetricsPort(-1).ok());
  EXPECT_TRUE(ValidateMetricsPort(65535).ok());
  EXPECT_EQ(ValidateMetricsPort(-2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateMetricsPort(65536).code(),
            absl::StatusCode::kInvalidArgument);
  WorkerMetrics m(0);
  EXPECT_EQ(m.Serve("127.0.0.1", 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Serve("127.0.0.1", 70000).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dp
