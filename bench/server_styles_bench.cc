// The three ways gRPC 1.51 serves a unary call, on the smallest dp.v1 call
// (GetStatus, answered the same by all, so that only the style differs): the
// callback (reactor) API dp-ps uses, the synchronous server (its thread
// pool), and one thread driving one completion queue. A client process
// calls each in turn, interleaved round by round over loopback TCP; prints
// per style the median round trip and the server process's CPU per call,
// and both as a ratio to the callback server's. Asserts nothing.
// Usage: server_styles_bench [calls per round, default 2000] [rounds, 7]
//   [answer bytes, default 0: an empty answer; 940000: SimpleNet's weights]
#include <grpcpp/grpcpp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cpu_time.h"
#include "proto/dp.grpc.pb.h"
#include "proto/grpc_server.h"

namespace dp {
namespace {

using dp::v1::GetStatusRequest;
using dp::v1::GetStatusResponse;
using dp::v1::ParameterServer;

// Every style's answer: empty, or `params` of the size asked for.
GetStatusResponse& Answer() {
  static GetStatusResponse* answer = new GetStatusResponse;
  return *answer;
}

class CallbackStatus final
    : public ParameterServer::WithCallbackMethod_GetStatus<
          ParameterServer::Service> {
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* ctx,
                                      const GetStatusRequest*,
                                      GetStatusResponse* response) override {
    *response = Answer();
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

class SyncStatus final : public ParameterServer::Service {
  grpc::Status GetStatus(grpc::ServerContext*, const GetStatusRequest*,
                         GetStatusResponse* response) override {
    *response = Answer();
    return grpc::Status::OK;
  }
};

// One thread: Next, answer, ask for the next call.
class CompletionQueueStatus {
 public:
  explicit CompletionQueueStatus(int* port) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             port);
    // StartGrpcServer's settings that bear on one call (it cannot add a
    // completion queue).
    const GrpcServerOptions same;
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    builder.SetMaxReceiveMessageSize(same.max_message_bytes);
    builder.SetMaxSendMessageSize(same.max_message_bytes);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
                               same.max_message_bytes);
    builder.RegisterService(&service_);
    cq_ = builder.AddCompletionQueue();
    server_ = builder.BuildAndStart();
    thread_ = std::thread([this] { Loop(); });
  }
  ~CompletionQueueStatus() {
    server_->Shutdown();
    cq_->Shutdown();
    thread_.join();
  }

 private:
  struct Call {
    grpc::ServerContext ctx;
    GetStatusRequest request;
    GetStatusResponse response;
    grpc::ServerAsyncResponseWriter<GetStatusResponse> writer{&ctx};
    bool answered = false;
  };
  void Expect() {
    Call* c = new Call;
    service_.RequestGetStatus(&c->ctx, &c->request, &c->writer, cq_.get(),
                              cq_.get(), c);
  }
  void Loop() {
    Expect();
    void* tag = nullptr;
    bool ok = false;
    while (cq_->Next(&tag, &ok)) {
      Call* c = static_cast<Call*>(tag);
      if (!ok || c->answered) {  // sent, or the server is shutting down
        delete c;
        continue;
      }
      Expect();
      c->response = Answer();
      c->answered = true;
      c->writer.Finish(c->response, grpc::Status::OK, c);
    }
  }

  ParameterServer::WithAsyncMethod_GetStatus<ParameterServer::Service> service_;
  std::unique_ptr<grpc::ServerCompletionQueue> cq_;
  std::unique_ptr<grpc::Server> server_;
  std::thread thread_;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

constexpr int kStyles = 3;
const char* const kNames[kStyles] = {"callback (dp-ps)", "synchronous",
                                     "one completion-queue thread"};

// What the client process tells the server process: a round of `style`
// begins (wall_ms < 0) or ended, taking wall_ms per call.
struct Mark {
  int style;
  double wall_ms;
};

// All `n` bytes through `io` (read or write), or false.
template <typename Io, typename Byte>
bool Whole(Io io, int fd, Byte* p, size_t n) {
  while (n > 0) {
    const ssize_t done = io(fd, p, n);
    if (done <= 0) return false;
    p += done;
    n -= done;
  }
  return true;
}

bool ReadAll(int fd, void* p, size_t n) {
  return Whole(read, fd, static_cast<char*>(p), n);
}

bool WriteAll(int fd, const void* p, size_t n) {
  return Whole(write, fd, static_cast<const char*>(p), n);
}

// The client: calls each server in turn, round by round, and marks each
// round's beginning and end for the server process.
int Client(const int (&ports)[kStyles], int calls, int rounds, int marks) {
  std::unique_ptr<ParameterServer::Stub> stubs[kStyles];
  for (int k = 0; k < kStyles; ++k) {
    stubs[k] = ParameterServer::NewStub(grpc::CreateCustomChannel(
        absl::StrCat("127.0.0.1:", ports[k]),
        grpc::InsecureChannelCredentials(),
        ClientChannelArguments(GrpcServerOptions().max_message_bytes)));
  }
  auto call = [&](int k) {
    grpc::ClientContext ctx;
    GetStatusRequest q;
    GetStatusResponse r;
    if (!stubs[k]->GetStatus(&ctx, q, &r).ok()) std::abort();
  };
  for (int k = 0; k < kStyles; ++k) {
    for (int i = 0; i < 200; ++i) call(k);  // connect and warm up
  }
  for (int r = 0; r < rounds; ++r) {
    for (int k = 0; k < kStyles; ++k) {
      Mark m{k, -1};
      if (!WriteAll(marks, &m, sizeof(m))) return 1;
      const absl::Time t0 = absl::Now();
      for (int i = 0; i < calls; ++i) call(k);
      m.wall_ms = absl::ToDoubleMilliseconds(absl::Now() - t0) / calls;
      if (!WriteAll(marks, &m, sizeof(m))) return 1;
    }
  }
  return 0;
}

int Main(int argc, char** argv) {
  int calls = 2000, rounds = 7, bytes = 0;
  if ((argc > 1 && !absl::SimpleAtoi(argv[1], &calls)) ||
      (argc > 2 && !absl::SimpleAtoi(argv[2], &rounds)) ||
      (argc > 3 && !absl::SimpleAtoi(argv[3], &bytes)) || calls < 1 ||
      rounds < 1 || bytes < 0 || bytes > (3 << 20)) {
    std::fprintf(stderr,
                 "usage: %s [calls per round] [rounds] [answer bytes, at "
                 "most 3 MiB]\n",
                 argv[0]);
    return 2;
  }
  Answer().set_params(std::string(bytes, '\x01'));
  // Two processes, forked before gRPC starts a thread, so that the
  // server's CPU is its process's alone (in one process the client's calls
  // would run on the same gRPC threads).
  int to_client[2], to_server[2];
  if (pipe(to_client) != 0 || pipe(to_server) != 0) return 1;
  const pid_t child = fork();
  if (child < 0) return 1;
  if (child == 0) {
    close(to_client[1]);
    close(to_server[0]);
    int ports[kStyles];
    if (!ReadAll(to_client[0], ports, sizeof(ports))) _exit(1);
    _exit(Client(ports, calls, rounds, to_server[1]));
  }
  close(to_client[0]);
  close(to_server[1]);

  CallbackStatus callback_service;
  SyncStatus sync_service;
  GrpcServerOptions options;
  options.address = "127.0.0.1:0";
  auto callback_server = StartGrpcServer(options, {&callback_service});
  auto sync_server = StartGrpcServer(options, {&sync_service});
  if (!callback_server.ok() || !sync_server.ok()) return 1;
  int cq_port = 0;
  CompletionQueueStatus cq_server(&cq_port);
  if (cq_port == 0) return 1;
  const int ports[kStyles] = {callback_server->port, sync_server->port,
                              cq_port};
  if (!WriteAll(to_client[1], ports, sizeof(ports))) return 1;

  std::vector<double> wall_ms[kStyles], cpu_ms[kStyles];
  absl::Duration began;
  Mark m;
  while (ReadAll(to_server[0], &m, sizeof(m))) {
    if (m.style < 0 || m.style >= kStyles) return 1;
    if (m.wall_ms < 0) {
      began = ProcessCpuTime();
      continue;
    }
    wall_ms[m.style].push_back(m.wall_ms);
    cpu_ms[m.style].push_back(
        absl::ToDoubleMilliseconds(ProcessCpuTime() - began) / calls);
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0 ||
      static_cast<int>(wall_ms[0].size()) != rounds) {
    std::fprintf(stderr, "the client process failed\n");
    return 1;
  }
  const double wall0 = Median(wall_ms[0]), cpu0 = Median(cpu_ms[0]);
  std::printf(
      "%d rounds of %d GetStatus calls answered with %d bytes, "
      "medians per call\n",
      rounds, calls, bytes);
  std::printf("%-30s %10s %8s %14s %8s\n", "server", "round trip ms", "ratio",
              "server CPU ms", "ratio");
  for (int k = 0; k < kStyles; ++k) {
    const double wall = Median(wall_ms[k]), cpu = Median(cpu_ms[k]);
    std::printf("%-30s %10.4f %7.2fx %14.4f %7.2fx\n", kNames[k], wall,
                wall / wall0, cpu, cpu / cpu0);
  }
  return 0;
}

}  // namespace
}  // namespace dp

int main(int argc, char** argv) { return dp::Main(argc, argv); }
