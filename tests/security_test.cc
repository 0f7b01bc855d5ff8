// Who may talk to dp-ps, over real gRPC on loopback: TLS and mTLS with
// certificates made by the openssl CLI, the shared token, keepalive settings
// that both sides accept, and the configuration errors of each. Every refused
// call leaves the weights, Adam state, step and registered ranks unchanged.
#include "proto/security.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "proto/grpc_server.h"
#include "server/ps_service.h"
#include "tests/coordinator_harness.h"
#include "tests/raw_client.h"
#include "tests/same_state.h"
#include "tests/test_certs.h"

namespace dp {
namespace {

using Stub = dp::v1::ParameterServer::Stub;

const ModelLayout& Layout() {
  static const ModelLayout* layout =
      new ModelLayout(ModelLayout::Mlp({8, 4, 3}));
  return *layout;
}

void WriteTextFile(const std::string& path, const std::string& text,
                   mode_t mode = 0600) {
  std::ofstream(path) << text;
  chmod(path.c_str(), mode);
}

// dp-ps's service on loopback with the given security, over a 2-rank job.
class Server {
 public:
  explicit Server(const SecurityFlags& flags, KeepaliveOptions keepalive = {}) {
    CoordinatorSetup setup;
    setup.job = TestJob(2);
    setup.init_seed = 7;
    setup.registered = 0;
    coordinator_ = MakeTestCoordinator(Layout(), setup);
    auto security = LoadServerSecurity(flags);
    EXPECT_TRUE(security.ok()) << security.status();
    if (!security.ok()) return;
    service_ = std::make_unique<PsService>(
        coordinator_.get(), nullptr, PsServiceOptions{security->auth_token});
    GrpcServerOptions options;
    options.address = "127.0.0.1:0";
    options.credentials = security->credentials;
    options.keepalive = keepalive;
    options.max_message_bytes = MessageBytesFor(Layout().num_params());
    auto running = StartGrpcServer(options, {service_.get()});
    EXPECT_TRUE(running.ok()) << running.status();
    if (!running.ok()) return;
    server_ = std::move(running->server);
    port_ = running->port;
    initial_ = coordinator_->Snapshot();
  }
  ~Server() {
    coordinator_->Shutdown();
    service_->EndAttendance();
    if (server_) server_->Shutdown();
  }

  int port() const { return port_; }
  StepCoordinator& coordinator() { return *coordinator_; }
  // Nothing a client did changed the state or registered a rank.
  bool Untouched() const {
    return SameState(initial_, coordinator_->Snapshot()) &&
           coordinator_->Status().registered_ranks.empty();
  }

 private:
  std::unique_ptr<StepCoordinator> coordinator_;
  std::unique_ptr<PsService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  TrainingState initial_;
};

std::unique_ptr<Stub> Connect(int port, const SecurityFlags& flags,
                              KeepaliveOptions keepalive = {}) {
  auto security = LoadClientSecurity(flags);
  EXPECT_TRUE(security.ok()) << security.status();
  if (!security.ok()) return nullptr;
  grpc::ChannelArguments args =
      ClientChannelArguments(MessageBytesFor(Layout().num_params()), keepalive);
  if (!security->server_name.empty()) {
    args.SetSslTargetNameOverride(security->server_name);
  }
  // A connection of its own, so that one test's failed handshake does not
  // decide another's.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return dp::v1::ParameterServer::NewStub(grpc::CreateCustomChannel(
      absl::StrCat("127.0.0.1:", port), security->credentials, args));
}

// Register with a deadline, and `metadata` entries ("key", "value").
grpc::Status Register(
    Stub* stub, int rank,
    std::vector<std::pair<std::string, std::string>> metadata = {}) {
  return RawRegister(
      *stub,
      RawRegisterRequest(rank, Layout().Fingerprint(), DataFingerprint{100, 5}),
      nullptr, RawCall{absl::Seconds(10), std::move(metadata)});
}

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { certs_ = TestCerts::Make().release(); }
  static void TearDownTestSuite() { delete certs_; }
  void SetUp() override { ASSERT_NE(certs_, nullptr); }

  static TestCerts* certs_;
};
TestCerts* SecurityTest::certs_ = nullptr;

TEST_F(SecurityTest, MutualTlsAdmitsACertificateOfTheJobsCa) {
  Server server(certs_->Server(/*mutual=*/true));
  auto stub = Connect(server.port(), certs_->Client("client"));
  grpc::Status s = Register(stub.get(), 0);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(server.coordinator().Status().registered_ranks,
            std::vector<int>{0});
}

TEST_F(SecurityTest, MutualTlsRefusesMissingForeignAndExpiredCertificates) {
  Server server(certs_->Server(/*mutual=*/true));
  struct Case {
    const char* what;
    SecurityFlags flags;
  };
  const Case cases[] = {
      {"no client certificate", certs_->Client("")},
      {"certificate of another CA", certs_->Client("other_client")},
      {"expired certificate", certs_->Client("expired_client")},
      {"plaintext", SecurityFlags{}},
  };
  for (const Case& c : cases) {
    auto stub = Connect(server.port(), c.flags);
    grpc::Status s = Register(stub.get(), 0);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE)
        << c.what << ": " << s.error_message();
    std::printf("%s: %d %s\n", c.what, s.error_code(),
                s.error_message().c_str());
    EXPECT_TRUE(server.Untouched()) << c.what;
  }
  // The server still serves the job's own workers.
  auto good = Connect(server.port(), certs_->Client("client"));
  EXPECT_TRUE(Register(good.get(), 1).ok());
}

TEST_F(SecurityTest, TlsWithoutCaAdmitsClientsWithoutCertificates) {
  Server server(certs_->Server(/*mutual=*/false));
  auto stub = Connect(server.port(), certs_->Client(""));
  EXPECT_TRUE(Register(stub.get(), 0).ok());
  // But not plaintext.
  auto plain = Connect(server.port(), SecurityFlags{});
  EXPECT_EQ(Register(plain.get(), 1).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(SecurityTest, ClientRefusesAServerItCannotVerify) {
  Server server(certs_->Server(/*mutual=*/true));
  // Trusts another CA: dp-ps's certificate does not verify.
  auto stub = Connect(server.port(), certs_->Client("client", "other_ca"));
  EXPECT_EQ(Register(stub.get(), 0).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // The certificate names localhost and 127.0.0.1, not dp-ps.example.
  SecurityFlags wrong_name = certs_->Client("client");
  wrong_name.tls_server_name = "dp-ps.example";
  stub = Connect(server.port(), wrong_name);
  EXPECT_EQ(Register(stub.get(), 0).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(server.Untouched());
  SecurityFlags right_name = certs_->Client("client");
  right_name.tls_server_name = "localhost";
  stub = Connect(server.port(), right_name);
  EXPECT_TRUE(Register(stub.get(), 0).ok());
}

TEST_F(SecurityTest, TokenRightIsAdmittedWrongOrMissingIsUnauthenticated) {
  TempDir dir;
  const std::string token = "s3cret-token-0123456789abcdef";
  WriteTextFile(dir.File("token"), token + "\n");
  SecurityFlags server_flags;
  server_flags.auth_token_file = dir.File("token");
  Server server(server_flags);
  auto stub = Connect(server.port(), SecurityFlags{});
  const std::string right = "Bearer " + token;
  struct Case {
    const char* what;
    std::vector<std::pair<std::string, std::string>> metadata;
  };
  const Case cases[] = {
      {"missing", {}},
      {"wrong", {{"authorization", "Bearer s3cret-token-0123456789abcdeX"}}},
      {"prefix of the token", {{"authorization", right.substr(0, 20)}}},
      {"token without Bearer", {{"authorization", token}}},
      {"empty", {{"authorization", ""}}},
      {"right and wrong", {{"authorization", right}, {"authorization", "x"}}},
      {"other key", {{"x-token", right}}},
  };
  for (const Case& c : cases) {
    grpc::Status s = Register(stub.get(), 0, c.metadata);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << c.what << ": " << s.error_message();
    EXPECT_EQ(s.error_message().find(token), std::string::npos);
    EXPECT_TRUE(server.Untouched()) << c.what;
  }
  // Every RPC, not just Register, needs the token.
  grpc::ClientContext c1, c2, c3, c4, c5, c6;
  dp::v1::PullResponse pull;
  dp::v1::PushResponse push;
  dp::v1::BarrierResponse barrier;
  dp::v1::ReportEvalResponse eval;
  dp::v1::GetStatusResponse status;
  dp::v1::PullRequest pull_request;
  dp::v1::PushRequest push_request;
  push_request.set_gradient(std::string(Layout().num_params() * 4, '\0'));
  dp::v1::ReportEvalRequest eval_request;
  const grpc::Status statuses[] = {
      stub->Pull(&c1, pull_request, &pull),
      stub->Push(&c2, push_request, &push),
      stub->Barrier(&c3, dp::v1::BarrierRequest(), &barrier),
      stub->PushPull(&c4, push_request, &pull),
      stub->ReportEval(&c5, eval_request, &eval),
      stub->GetStatus(&c6, dp::v1::GetStatusRequest(), &status),
  };
  for (const grpc::Status& s : statuses) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << s.error_message();
  }
  EXPECT_TRUE(server.Untouched());
  EXPECT_TRUE(Register(stub.get(), 0, {{"authorization", right}}).ok());
}

TEST_F(SecurityTest, TokenAndMutualTlsTogether) {
  TempDir dir;
  WriteTextFile(dir.File("token"), "another-token-with-enough-bytes");
  SecurityFlags server_flags = certs_->Server(/*mutual=*/true);
  server_flags.auth_token_file = dir.File("token");
  Server server(server_flags);
  auto stub = Connect(server.port(), certs_->Client("client"));
  EXPECT_EQ(Register(stub.get(), 0).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(server.Untouched());
  EXPECT_TRUE(
      Register(stub.get(), 0,
               {{"authorization", "Bearer another-token-with-enough-bytes"}})
          .ok());
}

// gRPC servers hang up on clients that ping more often than their policy
// allows (GOAWAY "too_many_pings" after the third early ping). Two clients
// ping as often as they may (gRPC 1.51 spaces pings by at least a second)
// through a silent barrier wait: one at a server whose minimum interval is
// below the clients', as KeepaliveOptions' defaults are (20 s and 10 s),
// one at a server whose minimum is above it. The strict server's hang-up
// is the event: by then the lenient one has seen as many pings for as
// long, and its wait must still be open. No verdict hangs on how fast the
// pings come; the deadlines only bound a hang.
TEST_F(SecurityTest, KeepaliveOfBothSidesKeepsASilentWaitAlive) {
  struct Side {
    std::unique_ptr<Server> server;
    std::unique_ptr<Stub> stub;
    grpc::ClientContext ctx;
    dp::v1::BarrierResponse response;
    grpc::Status status;
  };
  auto open = [&](Side& side, bool lenient) {
    KeepaliveOptions k;
    k.client_time_ms = 20;
    k.timeout_ms = 5000;
    k.server_time_ms = 60'000;
    k.min_recv_ping_interval_ms = lenient ? 10 : 60'000;
    side.server = std::make_unique<Server>(certs_->Server(/*mutual=*/true), k);
    side.stub = Connect(side.server->port(), certs_->Client("client"), k);
    ASSERT_TRUE(Register(side.stub.get(), 0).ok());
    ASSERT_TRUE(Register(side.stub.get(), 1).ok());
    ASSERT_TRUE(
        RawPush(*side.stub,
                RawPushRequest(0, 0, std::vector<float>(Layout().num_params()),
                               /*loss=*/0.0f))
            .ok());
    // Rank 1 never pushes: the wait stays silent.
    side.ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(2)));
  };
  auto wait = [](Side& side) {
    dp::v1::BarrierRequest barrier;
    barrier.set_rank(0);
    side.status = side.stub->Barrier(&side.ctx, barrier, &side.response);
  };
  Side lenient, strict;
  ASSERT_NO_FATAL_FAILURE(open(lenient, true));
  ASSERT_NO_FATAL_FAILURE(open(strict, false));
  std::thread lenient_wait([&] { wait(lenient); });
  wait(strict);
  // The negative control: the strict server hangs up on the pinging client.
  EXPECT_EQ(strict.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << strict.status.error_message();
  // The lenient server's wait, as old, is still open: only our cancel ends
  // it.
  lenient.ctx.TryCancel();
  lenient_wait.join();
  EXPECT_EQ(lenient.status.error_code(), grpc::StatusCode::CANCELLED)
      << lenient.status.error_message();
  // And the defaults keep that relation.
  const KeepaliveOptions defaults;
  EXPECT_LE(defaults.min_recv_ping_interval_ms, defaults.client_time_ms);
}

TEST(SecurityConfigTest, ErrorsNameTheFlagAndTheFile) {
  TempDir dir;
  auto certs = TestCerts::Make();
  ASSERT_NE(certs, nullptr);
  WriteTextFile(dir.File("garbage.pem"), "not a certificate\n");
  WriteTextFile(dir.File("short"), "short\n");
  WriteTextFile(dir.File("spaces"), "a token with spaces in it\n");
  struct Case {
    const char* what;
    SecurityFlags flags;
    std::string expected;  // in the message
  };
  SecurityFlags missing = certs->Server(true);
  missing.tls_cert = dir.File("nonexistent.pem");
  SecurityFlags garbage_cert = certs->Server(true);
  garbage_cert.tls_cert = dir.File("garbage.pem");
  SecurityFlags garbage_ca = certs->Server(true);
  garbage_ca.tls_ca = dir.File("garbage.pem");
  SecurityFlags garbage_key = certs->Server(true);
  garbage_key.tls_key = dir.File("garbage.pem");
  SecurityFlags wrong_key = certs->Server(true);
  wrong_key.tls_key = certs->File("client.key");
  SecurityFlags cert_only = certs->Server(false);
  cert_only.tls_key.clear();
  SecurityFlags ca_only;
  ca_only.tls_ca = certs->File("ca.pem");
  SecurityFlags short_token;
  short_token.auth_token_file = dir.File("short");
  SecurityFlags spaced_token;
  spaced_token.auth_token_file = dir.File("spaces");
  SecurityFlags missing_token;
  missing_token.auth_token_file = dir.File("nonexistent");
  const Case cases[] = {
      {"missing certificate", missing,
       "--tls_cert: cannot read " + missing.tls_cert},
      {"garbage certificate", garbage_cert,
       "--tls_cert " + garbage_cert.tls_cert},
      {"garbage CA", garbage_ca, "--tls_ca " + garbage_ca.tls_ca},
      {"garbage key", garbage_key, "--tls_key " + garbage_key.tls_key},
      {"key of another certificate", wrong_key,
       "does not belong to the certificate"},
      {"certificate without key", cert_only, "--tls_cert and --tls_key"},
      {"CA without certificate", ca_only, "--tls_ca"},
      {"short token", short_token,
       "--auth_token_file " + short_token.auth_token_file},
      {"token with spaces", spaced_token, "printable ASCII without spaces"},
      {"missing token file", missing_token,
       "--auth_token_file: cannot read " + missing_token.auth_token_file},
  };
  for (const Case& c : cases) {
    auto s = LoadServerSecurity(c.flags);
    ASSERT_FALSE(s.ok()) << c.what;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(s.status().message().find(c.expected), std::string::npos)
        << c.what << ": " << s.status().message();
  }
  // The client checks its files the same way.
  SecurityFlags client = certs->Client("client");
  client.tls_key = certs->File("other_client.key");
  EXPECT_FALSE(LoadClientSecurity(client).ok());
  SecurityFlags name_without_tls;
  name_without_tls.tls_server_name = "localhost";
  EXPECT_FALSE(LoadClientSecurity(name_without_tls).ok());
}

TEST(SecurityConfigTest, TokenFileIsTrimmedAndComparedExactly) {
  TempDir dir;
  WriteTextFile(dir.File("t"), "0123456789abcdef0123\r\n");
  auto token = ReadAuthToken(dir.File("t"));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "0123456789abcdef0123");
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abcd"));
  EXPECT_FALSE(ConstantTimeEquals("", "a"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
}

TEST(SecurityConfigTest, TokenFileReadableByOtherUsersIsWarnedAbout) {
  constexpr unsigned kOwn = 65532, kOther = 100;
  // Only the owner, or also the process's own group (a Kubernetes Secret
  // mounted with the pod's fsGroup, 0440 at least): no warning.
  for (unsigned mode : {0600u, 0400u, 0640u, 0440u, 0660u}) {
    EXPECT_FALSE(TokenModeWarning("t", mode, kOwn, kOwn).has_value())
        << std::oct << mode;
  }
  // Others, or another group.
  for (unsigned mode : {0604u, 0644u, 0444u, 0601u}) {
    auto warning = TokenModeWarning("t", mode, kOwn, kOwn);
    ASSERT_TRUE(warning.has_value()) << std::oct << mode;
    EXPECT_NE(warning->find("readable by other users"), std::string::npos);
  }
  auto warning = TokenModeWarning("t", 0640, kOther, kOwn);
  ASSERT_TRUE(warning.has_value());
  EXPECT_NE(warning->find("group 100 is not this process's 65532"),
            std::string::npos)
      << *warning;
  EXPECT_FALSE(TokenModeWarning("t", 0600, kOther, kOwn).has_value());
}

TEST(SecurityConfigTest, PlaintextOnANonLoopbackAddressIsWarnedAbout) {
  for (const char* host :
       {"localhost", "127.0.0.1", "127.1.2.3", "::1", "[::1]"}) {
    EXPECT_TRUE(IsLoopbackHost(host)) << host;
    EXPECT_FALSE(PlaintextWarning(host, ServerSecurity{}).has_value()) << host;
  }
  for (const char* host : {"0.0.0.0", "", "::", "10.0.0.1", "dp-ps.example",
                           "128.0.0.1", "[::1"}) {
    EXPECT_FALSE(IsLoopbackHost(host)) << host;
    auto warning = PlaintextWarning(host, ServerSecurity{});
    ASSERT_TRUE(warning.has_value()) << host;
    EXPECT_NE(warning->find("without TLS"), std::string::npos);
  }
  ServerSecurity tls;
  tls.tls = true;
  EXPECT_FALSE(PlaintextWarning("0.0.0.0", tls).has_value());
}

}  // namespace
}  // namespace dp
