// dp-ps's --health_port as the kubelet's gRPC probes use it, with a real
// dp-ps serving mTLS on its main port: the plaintext health port answers
// readiness and liveness, the main port refuses plaintext, the health port
// serves nothing but health, and readiness turns NOT_SERVING on SIGTERM.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/flags.h"
#include "proto/grpc_server.h"
#include "gtest/gtest.h"
#include "proto/dp.grpc.pb.h"
#include "tests/health_client.h"
#include "tests/job_runner.h"
#include "tests/subprocess.h"
#include "tests/test_certs.h"

namespace dp {
namespace {

const absl::Duration kTimeout = absl::Seconds(30);

std::string Address(int port) { return absl::StrCat("127.0.0.1:", port); }

// The port dp-ps logs for its health service, or -1.
int HealthPortOf(const Subprocess& ps) {
  auto field = ps.Field("health service on port ");
  int port = -1;
  if (field.has_value() && !absl::SimpleAtoi(*field, &port)) port = -1;
  return port;
}

grpc::Status PlaintextGetStatus(int port) {
  auto stub = dp::v1::ParameterServer::NewStub(
      grpc::CreateChannel(Address(port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  dp::v1::GetStatusResponse response;
  return stub->GetStatus(&context, {}, &response);
}

TEST(PsHealthPortTest,
     PlaintextHealthPortAnswersWhileTheMtlsPortRefusesPlaintext) {
  auto certs = TestCerts::Make();
  ASSERT_NE(certs, nullptr);
  std::vector<std::string> args = {"--workers=2", "--dataset=synthetic",
                                   "--health_port=0"};
  for (const std::string& a : TestCerts::Args(certs->Server(/*mutual=*/true))) {
    args.push_back(a);
  }
  int port = 0;
  auto ps = StartServer(args, &port);
  ASSERT_GT(port, 0) << ps->output();
  const int health_port = HealthPortOf(*ps);
  ASSERT_GT(health_port, 0) << ps->output();
  ASSERT_NE(health_port, port);

  // The probes' view: plaintext, no certificate.
  auto ready = CheckHealth(Address(health_port), "");
  ASSERT_TRUE(ready.ok()) << ready.status();
  EXPECT_EQ(*ready, kServing);
  auto live = CheckHealth(Address(health_port), kLivenessService);
  ASSERT_TRUE(live.ok()) << live.status();
  EXPECT_EQ(*live, kServing);
  auto service = CheckHealth(Address(health_port),
                             dp::v1::ParameterServer::service_full_name());
  ASSERT_TRUE(service.ok()) << service.status();
  EXPECT_EQ(*service, kServing);

  // The main port completes no plaintext call, not even a health check.
  auto main_health = CheckHealth(Address(port), "");
  EXPECT_FALSE(main_health.ok());
  EXPECT_FALSE(PlaintextGetStatus(port).ok());
  // The health port serves no training service.
  EXPECT_EQ(PlaintextGetStatus(health_port).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);

  // Draining shows on the health port before dp-ps exits.
  HealthWatcher readiness(Address(health_port), "");
  ASSERT_TRUE(readiness.WaitFor(kServing, kTimeout));
  ps->Signal(SIGTERM);
  EXPECT_TRUE(readiness.WaitFor(kNotServing, kTimeout));
  EXPECT_EQ(ps->Wait(kTimeout), kExitInterrupted) << ps->output();
}

TEST(PsHealthPortTest, HealthPortIsOffByDefaultAndRangeChecked) {
  int port = 0;
  auto ps = StartServer({"--workers=1", "--dataset=synthetic"}, &port);
  ASSERT_GT(port, 0) << ps->output();
  EXPECT_EQ(HealthPortOf(*ps), -1) << ps->output();
  ps->Signal(SIGTERM);
  EXPECT_EQ(ps->Wait(kTimeout), kExitInterrupted) << ps->output();

  Subprocess bad({DP_PS_BINARY, "--health_port=70000", "--dry_run"});
  EXPECT_EQ(bad.Wait(kTimeout), kExitConfigError) << bad.output();
}

}  // namespace
}  // namespace dp
