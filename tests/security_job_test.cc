// Security with real dp-ps and dp-worker processes on loopback: an mTLS job
// trains while workers without an accepted certificate are refused; a token
// job trains while workers without the right token are refused; bad security
// files are configuration errors; and a crowd of hostile clients changes
// neither the outcome nor a single bit of the trained model.
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "common/flags.h"
#include "common/model_layout.h"
#include "gtest/gtest.h"
#include "proto/dp.grpc.pb.h"
#include "proto/grpc_server.h"
#include "proto/security.h"
#include "tests/job_runner.h"
#include "tests/raw_client.h"
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
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  // A new connection whose first handshake fails (seen on a loaded
  // machine) is tried again until the deadline, as a worker's calls are,
  // rather than failing the query at once.
  ctx.set_wait_for_ready(true);
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

// A short job's dp-ps that requires client certificates of `certs`' CA.
std::unique_ptr<Subprocess> StartMutualTlsServer(const TestCerts& certs,
                                                 int* port) {
  return StartServer(
      Concat(ShortJob(), TestCerts::Args(certs.Server(/*mutual=*/true))), port);
}

TEST(SecurityJobTest, MutualTlsJobTrainsAndRefusedWorkersChangeNothing) {
  auto certs = TestCerts::Make();
  ASSERT_NE(certs, nullptr);
  int port = 0;
  auto ps = StartMutualTlsServer(*certs, &port);
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
    // From the worker a refused handshake looks like no dp-ps at all.
    EXPECT_EQ(rc, kExitPsUnreachable) << c.what << "\n" << w->output();
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

// A refused worker gives up while gRPC is still reconnecting in its threads,
// loading the TLS key for the next handshake. That used to race with
// OpenSSL's clean-up at exit: about one refused worker in five died of
// SIGSEGV instead of exiting with its code. Many tries, four at a time.
TEST(SecurityJobTest, RefusedWorkersExitWithTheirCodeEveryTime) {
  auto certs = TestCerts::Make();
  ASSERT_NE(certs, nullptr);
  int port = 0;
  auto ps = StartMutualTlsServer(*certs, &port);
  ASSERT_GT(port, 0);
  const std::vector<std::string> refused = Concat(
      TestCerts::Args(certs->Client("other_client")), {"--retry_for_s=1"});
  for (int round = 0; round < 6; ++round) {
    std::vector<std::unique_ptr<Subprocess>> workers;
    for (int i = 0; i < 4; ++i)
      workers.push_back(StartWorker(port, 0, refused));
    for (auto& w : workers)
      EXPECT_EQ(w->Wait(kJobTimeout), kExitPsUnreachable) << w->output();
  }
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

// --- Hostile clients --------------------------------------------------------

// Threads that send dp-ps every kind of request it must refuse, each over a
// connection of its own, plus raw TCP connections that send garbage or
// nothing at all, until Stop(). Bounded: each thread has one request or
// connection in flight. Counts the status codes that came back.
class HostileClients {
 public:
  HostileClients(int port, const std::string& token, int grpc_threads,
                 int idle_sockets, int garbage_threads)
      : port_(port), token_(token) {
    for (int i = 0; i < grpc_threads; ++i) {
      threads_.emplace_back([this, i] { RunGrpc(i); });
    }
    threads_.emplace_back([this, idle_sockets, garbage_threads] {
      RunSockets(idle_sockets, garbage_threads);
    });
  }
  ~HostileClients() { Stop(); }

  void Stop() {
    stop_.store(true);
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  // Blocks until `n` requests have come back (or `timeout` passes).
  bool AwaitRequests(int n, absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]()
                      ABSL_SHARED_LOCKS_REQUIRED(mu_) { return total_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
  // "<kind> -> <code>" -> count.
  std::map<std::string, int> counts() const {
    absl::MutexLock lock(&mu_);
    return counts_;
  }

 private:
  void Count(const std::string& kind, const grpc::Status& s) {
    absl::MutexLock lock(&mu_);
    ++counts_[absl::StrCat(kind, " -> ", s.error_code())];
    ++total_;
  }

  void RunGrpc(int seed) {
    // Its own connection, and a message limit above dp-ps's so that
    // oversized requests reach the server.
    grpc::ChannelArguments args = ClientChannelArguments(8 << 20);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto stub = dp::v1::ParameterServer::NewStub(
        grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port_),
                                  grpc::InsecureChannelCredentials(), args));
    const ModelLayout layout = ModelLayout::SimpleNet();
    const int64_t n = layout.num_params();
    std::mt19937 rng(seed);
    std::string gradient(n * sizeof(float), '\0');
    for (size_t i = 0; i < gradient.size(); ++i) gradient[i] = rng() & 0x3f;
    std::string nan_gradient = gradient;
    const float nan = std::nanf("");
    std::memcpy(nan_gradient.data() + 4 * (rng() % n), &nan, sizeof(nan));
    const std::string wrong_token = token_ + "x";
    for (int round = 0; !stop_.load(); ++round) {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
      const int kind = (round + seed) % 11;
      if (kind == 0) {
        // No token at all.
      } else if (kind == 1) {
        AttachToken(wrong_token, &ctx);
      } else {
        AttachToken(token_, &ctx);
      }
      dp::v1::PushRequest push;
      push.set_rank(static_cast<int>(rng() % 2));
      push.set_step(0);
      push.set_gradient(gradient);
      dp::v1::PushResponse push_response;
      dp::v1::PullResponse pull_response;
      switch (kind) {
        case 0: {  // a well-formed push without a token
          Count("push without token", stub->Push(&ctx, push, &push_response));
          break;
        }
        case 1: {  // a well-formed fused push with a wrong token
          Count("push-pull with wrong token",
                stub->PushPull(&ctx, push, &pull_response));
          break;
        }
        case 2:
          push.set_gradient(nan_gradient);
          Count("NaN gradient", stub->PushPull(&ctx, push, &pull_response));
          break;
        case 3:
          push.mutable_gradient()->append(4, '\0');
          Count("long gradient", stub->Push(&ctx, push, &push_response));
          break;
        case 4:
          push.mutable_gradient()->append(gradient);
          Count("oversized message", stub->Push(&ctx, push, &push_response));
          break;
        case 5:
          push.set_rank(2 + static_cast<int>(rng() % 1000));
          Count("rank out of range", stub->Push(&ctx, push, &push_response));
          break;
        case 6: {
          const dp::v1::RegisterRequest r =
              RawRegisterRequest(0, rng(), DataFingerprint{1000, 0});
          dp::v1::RegisterResponse response;
          Count("wrong model", stub->Register(&ctx, r, &response));
          break;
        }
        case 7: {
          dp::v1::PullRequest r;
          r.set_rank(1);
          r.set_offset(std::numeric_limits<int64_t>::max() - 3);
          r.set_length(10);
          Count("pull range", stub->Pull(&ctx, r, &pull_response));
          break;
        }
        case 8: {
          dp::v1::BarrierRequest r;
          r.set_rank(0);
          r.set_step(-1 - static_cast<int64_t>(rng() % 100));
          dp::v1::BarrierResponse response;
          Count("negative step", stub->Barrier(&ctx, r, &response));
          break;
        }
        case 9: {
          dp::v1::ReportEvalRequest r;
          r.set_accuracy(std::nan(""));
          dp::v1::ReportEvalResponse response;
          Count("NaN accuracy", stub->ReportEval(&ctx, r, &response));
          break;
        }
        case 10: {
          // Valid but for the id: a validator that let it through would
          // let this request define the job's data set.
          dp::v1::RegisterRequest r = RawRegisterRequest(
              1, layout.Fingerprint(), DataFingerprint{1000, 0});
          r.set_worker_id(std::string(4000, 'w'));
          dp::v1::RegisterResponse response;
          Count("long worker id", stub->Register(&ctx, r, &response));
          break;
        }
      }
    }
  }

  // Connections that open and then say nothing, held for the whole run,
  // and connections that send garbage and wait for dp-ps to hang up, one
  // at a time per thread.
  void RunSockets(int idle, int garbage_threads) {
    std::vector<int> fds;
    for (int i = 0; i < idle; ++i) {
      if (int fd = OpenSocket(); fd >= 0) fds.push_back(fd);
    }
    std::vector<std::thread> senders;
    for (int t = 0; t < garbage_threads; ++t) {
      senders.emplace_back([this, t] {
        std::mt19937 rng(99 + t);
        std::string junk(4096, '\0');
        char buf[4096];
        while (!stop_.load()) {
          const int fd = OpenSocket();
          if (fd < 0) continue;
          for (char& c : junk) c = static_cast<char>(rng());
          // The server may hang up mid-write: no SIGPIPE.
          (void)send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
          timeval timeout{1, 0};
          setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
          while (recv(fd, buf, sizeof(buf), 0) > 0) {
          }
          close(fd);
          absl::MutexLock lock(&mu_);
          ++counts_["garbage connection"];
        }
      });
    }
    for (auto& t : senders) t.join();
    for (int fd : fds) close(fd);
  }

  int OpenSocket() const {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port_));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd >= 0 && connect(fd, reinterpret_cast<const sockaddr*>(&addr),
                           sizeof(addr)) != 0) {
      close(fd);
      return -1;
    }
    return fd;
  }

  const int port_;
  const std::string token_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
  mutable absl::Mutex mu_;
  std::map<std::string, int> counts_ ABSL_GUARDED_BY(mu_);
  int total_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST(SecurityJobTest, HostileClientsChangeNeitherTheOutcomeNorTheModel) {
  TempDir dir;
  const std::string token_text = "hostile-test-token-57ab19e0";
  const std::string token = WriteToken(dir, "token", token_text);
  const std::vector<std::string> worker_args = {"--auth_token_file=" + token};

  // The same job without hostile clients.
  const std::string reference = dir.File("reference.safetensors");
  constexpr int kSteps = 100;
  std::vector<std::string> flags = ShortJob(reference, kSteps);
  flags.erase(flags.begin());  // RunJob adds --workers
  flags.push_back("--auth_token_file=" + token);
  JobResult r = RunJob(flags, 2, worker_args);
  ASSERT_EQ(r.ps_exit, 0) << r.ps_output;

  const std::string model = dir.File("model.safetensors");
  int port = 0;
  auto ps = StartServer(
      Concat(ShortJob(model, kSteps), {"--auth_token_file=" + token}), &port);
  ASSERT_GT(port, 0);
  std::map<std::string, int> counts;
  {
    HostileClients hostile(port, token_text, /*grpc_threads=*/8,
                           /*idle_sockets=*/64, /*garbage_threads=*/4);
    // The crowd is at it before the workers arrive.
    ASSERT_TRUE(hostile.AwaitRequests(50, absl::Seconds(60)));
    auto w0 = StartWorker(port, 0, worker_args);
    auto w1 = StartWorker(port, 1, worker_args);
    EXPECT_EQ(w0->Wait(kJobTimeout), 0) << w0->output();
    EXPECT_EQ(w1->Wait(kJobTimeout), 0) << w1->output();
    EXPECT_EQ(ps->Wait(kJobTimeout), 0) << ps->output();
    hostile.Stop();
    counts = hostile.counts();
  }
  auto a = ReadFile(reference), b = ReadFile(model);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(*a == *b) << "hostile clients changed the trained model";

  // What the crowd got back: every request refused with its code (or cut
  // off when dp-ps went away at the end: UNAVAILABLE, CANCELLED), none
  // accepted.
  const std::map<std::string, grpc::StatusCode> expected = {
      {"push without token", grpc::StatusCode::UNAUTHENTICATED},
      {"push-pull with wrong token", grpc::StatusCode::UNAUTHENTICATED},
      {"NaN gradient", grpc::StatusCode::INVALID_ARGUMENT},
      {"long gradient", grpc::StatusCode::INVALID_ARGUMENT},
      {"oversized message", grpc::StatusCode::RESOURCE_EXHAUSTED},
      {"rank out of range", grpc::StatusCode::INVALID_ARGUMENT},
      {"wrong model", grpc::StatusCode::FAILED_PRECONDITION},
      {"pull range", grpc::StatusCode::INVALID_ARGUMENT},
      {"negative step", grpc::StatusCode::INVALID_ARGUMENT},
      {"NaN accuracy", grpc::StatusCode::INVALID_ARGUMENT},
      {"long worker id", grpc::StatusCode::INVALID_ARGUMENT},
  };
  int refused = 0;
  for (const auto& [key, count] : counts) {
    std::printf("  %-45s %d\n", key.c_str(), count);
    if (key == "garbage connection") continue;
    const std::string kind = key.substr(0, key.find(" -> "));
    const int code = std::stoi(key.substr(key.find(" -> ") + 4));
    ASSERT_TRUE(expected.count(kind)) << key;
    const bool as_expected = code == expected.at(kind);
    const bool cut_off = code == grpc::StatusCode::UNAVAILABLE ||
                         code == grpc::StatusCode::DEADLINE_EXCEEDED ||
                         code == grpc::StatusCode::CANCELLED;
    EXPECT_TRUE(as_expected || cut_off) << key;
    if (as_expected) refused += count;
  }
  // The crowd really was there while the job ran.
  EXPECT_GT(refused, 100);
  for (const auto& [kind, code] : expected) {
    EXPECT_GT(counts[absl::StrCat(kind, " -> ", code)], 0) << kind;
  }
}

}  // namespace
}  // namespace dp
