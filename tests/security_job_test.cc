// Security with real dp-ps and dp-worker processes on loopback: an mTLS job
// trains while workers without an accepted certificate are refused; a token
// job trains while workers without the right token are refused; bad security
// files are configuration errors.
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "common/flags.h"
#include "common/grpc_server.h"
#include "common/model_layout.h"
#include "common/security.h"
#include "gtest/gtest.h"
#include "proto/dp.grpc.pb.h"
#include "tests/job_runner.h"
#include "tests/test_certs.h"

namespace dp {
namespace {

using Stub = dp::v1::ParameterServer::Stub;

// A short job on synthetic data: seconds, not minutes.
std::vector<std::string> ShortJob(const std::string& model = "",
                                  int steps = 25) {
  std::vector<std::string> flags = {
      "--workers=2",     absl::StrCat("--max_steps=", steps),
      "--batch_size=16", "--dataset=synthetic",
      "--seed=11",       "--final_eval_timeout_s=30"};
  if (!model.empty()) flags.push_back("--save_model=" + model);
  return flags;
}

std::vector<std::string> Concat(std::vector<std::string> a,
                                const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::unique_ptr<Stub> Connect(int port, const SecurityFlags& flags) {
  auto security = LoadClientSecurity(flags);
  EXPECT_TRUE(security.ok()) << security.status();
  if (!security.ok()) return nullptr;
  grpc::ChannelArguments args = ClientChannelArguments(
      MessageBytesFor(ModelLayout::SimpleNet().num_params()));
  // Each stub gets a connection of its own, as separate clients would.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return dp::v1::ParameterServer::NewStub(grpc::CreateCustomChannel(
      absl::StrCat("127.0.0.1:", port), security->credentials, args));
}

// dp-ps's status as seen by a client with `flags` and `token`.
std::optional<dp::v1::GetStatusResponse> Status(int port,
                                                const SecurityFlags& flags,
                                                const std::string& token = "") {
  auto stub = Connect(port, flags);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  AttachToken(token, &ctx);
  dp::v1::GetStatusResponse response;
  grpc::Status s = stub->GetStatus(&ctx, dp::v1::GetStatusRequest(), &response);
  EXPECT_TRUE(s.ok()) << s.error_message();
  if (!s.ok()) return std::nullopt;
  return response;
}

std::string WriteToken(const TempDir& dir, const std::string& name,
                       const std::string& token) {
  const std::string path = dir.File(name);
  std::ofstream(path) << token << "\n";
  chmod(path.c_str(), 0600);
  return path;
}

TEST(SecurityJobTest, MutualTlsJobTrainsAndRefusedWorkersChangeNothing) {
  auto certs = TestCerts::Make();
  ASSERT_NE(certs, nullptr);
  int port = 0;
  auto ps = StartServer(
      Concat(ShortJob(), TestCerts::Args(certs->Server(/*mutual=*/true))),
      &port);
  ASSERT_GT(port, 0);
  EXPECT_NE(ps->output().find("security: mTLS"), std::string::npos)
      << ps->output();
  struct Case {
    const char* what;
    SecurityFlags flags;
  };
  const Case refused[] = {
      {"no client certificate", certs->Client("")},
      {"certificate of another CA", certs->Client("other_client")},
      {"expired certificate", certs->Client("expired_client")},
      {"plaintext", SecurityFlags{}},
  };
  for (const Case& c : refused) {
    auto w = StartWorker(port, 0,
                         Concat(TestCerts::Args(c.flags), {"--retry_for_s=1"}));
    const std::optional<int> rc = w->Wait(kJobTimeout);
    EXPECT_EQ(rc, kExitFailure) << c.what << "\n" << w->output();
    EXPECT_NE(w->output().find("TLS mismatch"), std::string::npos)
        << c.what << "\n"
        << w->output();
  }
  // Nothing reached the job: no rank registered, no step taken.
  auto status = Status(port, certs->Client("client"));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->step(), 0);
  EXPECT_TRUE(status->registered_ranks().empty());

  const std::vector<std::string> good =
      TestCerts::Args(certs->Client("client"));
  auto w0 = StartWorker(port, 0, good);
  auto w1 = StartWorker(port, 1, good);
  EXPECT_EQ(w0->Wait(kJobTimeout), 0) << w0->output();
  EXPECT_EQ(w1->Wait(kJobTimeout), 0) << w1->output();
  EXPECT_EQ(ps->Wait(kJobTimeout), 0) << ps->output();
  EXPECT_NE(ps->output().find("final test accuracy"), std::string::npos);
}

TEST(SecurityJobTest, TokenJobTrainsAndWorkersWithoutTheTokenAreRefused) {
  TempDir dir;
  const std::string token =
      WriteToken(dir, "token", "job-token-4f9a2c7e81d3b605");
  const std::string wrong =
      WriteToken(dir, "wrong", "job-token-4f9a2c7e81d3b606");
  int port = 0;
  auto ps =
      StartServer(Concat(ShortJob(), {"--auth_token_file=" + token}), &port);
  ASSERT_GT(port, 0);
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{}, {"--auth_token_file=" + wrong}}) {
    auto w = StartWorker(port, 0, args);
    EXPECT_EQ(w->Wait(kJobTimeout), kExitConfigError) << w->output();
    EXPECT_NE(w->output().find("UNAUTHENTICATED"), std::string::npos)
        << w->output();
  }
  SecurityFlags plain;
  auto status = Status(port, plain, "job-token-4f9a2c7e81d3b605");
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->step(), 0);
  EXPECT_TRUE(status->registered_ranks().empty());
  auto w0 = StartWorker(port, 0, {"--auth_token_file=" + token});
  auto w1 = StartWorker(port, 1, {"--auth_token_file=" + token});
  EXPECT_EQ(w0->Wait(kJobTimeout), 0) << w0->output();
  EXPECT_EQ(w1->Wait(kJobTimeout), 0) << w1->output();
  EXPECT_EQ(ps->Wait(kJobTimeout), 0) << ps->output();
}

TEST(SecurityJobTest, BadSecurityFilesAreConfigurationErrorsNamingTheFile) {
  auto certs = TestCerts::Make();
  ASSERT_NE(certs, nullptr);
  TempDir dir;
  const std::string garbage = dir.File("garbage.pem");
  ASSERT_TRUE(
      WriteFileAtomic(garbage, "-----BEGIN CERTIFICATE-----\nxx\n").ok());
  const std::string missing = dir.File("missing.pem");
  struct Case {
    const char* binary;
    std::vector<std::string> args;
    std::string named;
  };
  const Case cases[] = {
      {DP_PS_BINARY,
       {"--tls_cert=" + missing, "--tls_key=" + certs->File("server.key")},
       missing},
      {DP_PS_BINARY,
       {"--tls_cert=" + certs->File("server.pem"),
        "--tls_key=" + certs->File("server.key"), "--tls_ca=" + garbage},
       garbage},
      {DP_PS_BINARY, {"--auth_token_file=" + missing}, missing},
      {DP_WORKER_BINARY, {"--rank=0", "--tls_ca=" + garbage}, garbage},
      {DP_WORKER_BINARY,
       {"--rank=0", "--tls_ca=" + certs->File("ca.pem"),
        "--tls_cert=" + certs->File("client.pem"),
        "--tls_key=" + certs->File("server.key")},
       certs->File("server.key")},
      {DP_WORKER_BINARY, {"--rank=0", "--auth_token_file=" + missing}, missing},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {c.binary, "--host=127.0.0.1", "--port=0"};
    if (std::string(c.binary) == DP_WORKER_BINARY) argv = {c.binary};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    Subprocess p(argv);
    EXPECT_EQ(p.Wait(absl::Seconds(30)), kExitConfigError) << p.output();
    EXPECT_NE(p.output().find(c.named), std::string::npos) << p.output();
  }
}

}  // namespace
}  // namespace dp
