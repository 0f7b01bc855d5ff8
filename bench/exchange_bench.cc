// Round-trip cost of the dp.v1 calls over loopback gRPC with SimpleNet-sized
// tensors: Pull, Push, PushPull (world size 1, so no waiting for peers), the
// empty round trip and PushPull also over a Unix socket (what a co-located
// worker would save on the control call without TCP), and the server-side
// update alone. Prints medians; asserts nothing.
// --update_only[=T]: only the update alone for N = 1, 2, 4, 8 with T threads
// (dp-ps's --update_threads), one "N ms" line each: the floor that
// scripts/perf-null.sh sets the null-compute steps against.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/malloc_tuning.h"
#include "common/parallel_for.h"
#include "proto/grpc_server.h"
#include "server/ps_service.h"

namespace dp {
namespace {

template <typename F>
double MedianMs(int repeats, int iters, F f) {
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) {
    const absl::Time t0 = absl::Now();
    for (int i = 0; i < iters; ++i) f();
    ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0) / iters);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// The average of n SimpleNet gradients + one Adam step, as dp-ps runs it.
class UpdateAlone {
 public:
  explicit UpdateAlone(const AdamOptions& adam)
      : adam_(adam),
        grads_(8, std::vector<float>(ModelLayout::SimpleNet().num_params(),
                                     1e-3f)),
        p_(InitParams(ModelLayout::SimpleNet(), 0)),
        m_(p_.size()),
        v_(p_.size()) {}
  void Run(int n, WorkerPool* threads) {
    std::vector<const float*> grads;
    for (int r = 0; r < n; ++r) grads.push_back(grads_[r].data());
    AverageAndAdamStep(adam_, 1, 1, grads, p_.size(), p_.data(), m_.data(),
                       v_.data(), threads);
  }

 private:
  const AdamOptions adam_;
  std::vector<std::vector<float>> grads_;  // (8, num_params), rank r's
  std::vector<float> p_, m_, v_;
};

int UpdateOnly(int threads) {
  UpdateAlone update(JobConfig().adam);
  std::unique_ptr<WorkerPool> pool;
  if (threads > 1) pool = std::make_unique<WorkerPool>(threads);
  for (int n : {1, 2, 4, 8}) {
    update.Run(n, pool.get());  // first touch outside the timing
    std::printf("%d %.4f\n", n,
                MedianMs(7, 50, [&] { update.Run(n, pool.get()); }));
  }
  return 0;
}

int Main() {
  const ModelLayout layout = ModelLayout::SimpleNet();
  JobConfig config;
  config.schedule.world_size = 1;
  config.schedule.batch_size = 1;
  config.schedule.epochs = 1000000;
  config.dataset = "synthetic";
  TrainingState state;
  state.params = InitParams(layout, 0);
  StepCoordinator coordinator(layout, config, state);
  PsService service(&coordinator);
  GrpcServerOptions options;
  options.address = "127.0.0.1:0";
  options.max_message_bytes = MessageBytesFor(layout.num_params());
  auto running = StartGrpcServer(options, {&service});
  if (!running.ok()) return 1;
  // The same coordinator behind a second server on a Unix socket in the
  // abstract namespace.
  PsService unix_service(&coordinator);
  GrpcServerOptions unix_options = options;
  unix_options.address =
      absl::StrCat("unix-abstract:dp-exchange-bench-", getpid());
  auto unix_running = StartGrpcServer(unix_options, {&unix_service});
  if (!unix_running.ok()) return 1;
  auto stub_at = [&](const std::string& target) {
    return dp::v1::ParameterServer::NewStub(grpc::CreateCustomChannel(
        target, grpc::InsecureChannelCredentials(),
        ClientChannelArguments(options.max_message_bytes)));
  };
  auto tcp_stub = stub_at(absl::StrCat("127.0.0.1:", running->port));
  auto unix_stub = stub_at(unix_options.address);
  dp::v1::ParameterServer::Stub* stub = tcp_stub.get();
  if (!coordinator.Register(0, layout.Fingerprint(), {1000000, 1}).ok())
    return 1;

  std::vector<float> grad(layout.num_params(), 1e-3f);
  dp::v1::PushRequest push;
  push.set_rank(0);
  push.set_gradient(
      std::string(reinterpret_cast<const char*>(grad.data()), grad.size() * 4));
  int64_t step = 0;
  dp::v1::PullRequest pull_req;
  dp::v1::PullResponse pull_resp;
  auto pull = [&] {
    grpc::ClientContext ctx;
    stub->Pull(&ctx, pull_req, &pull_resp);
  };
  auto push_pull = [&] {
    push.set_step(step++);
    grpc::ClientContext ctx;
    if (!stub->PushPull(&ctx, push, &pull_resp).ok()) std::abort();
  };
  auto push_only = [&] {
    push.set_step(step++);
    grpc::ClientContext ctx;
    dp::v1::PushResponse r;
    if (!stub->Push(&ctx, push, &r).ok()) std::abort();
  };
  auto status = [&] {
    grpc::ClientContext ctx;
    dp::v1::GetStatusRequest q;
    dp::v1::GetStatusResponse r;
    stub->GetStatus(&ctx, q, &r);
  };
  // The server update alone: average of N gradients + Adam, N = 1, 2, 4, 8,
  // on the calling thread only and with a pool of 2 threads.
  UpdateAlone update_alone(config.adam);
  WorkerPool two_threads(2);
  auto apply = [&](int n, WorkerPool* threads) {
    return [&, n, threads] { update_alone.Run(n, threads); };
  };
  for (int i = 0; i < 20; ++i) push_pull();
  std::printf("%-34s %10s\n", "operation (SimpleNet, 0.94 MB)", "median ms");
  std::printf("%-34s %10.3f\n", "GetStatus (empty round trip)",
              MedianMs(7, 50, status));
  std::printf("%-34s %10.3f\n", "Pull", MedianMs(7, 50, pull));
  std::printf("%-34s %10.3f\n", "Push (+ apply, N=1)",
              MedianMs(7, 50, push_only));
  std::printf("%-34s %10.3f\n", "PushPull (+ apply, N=1)",
              MedianMs(7, 50, push_pull));
  stub = unix_stub.get();
  for (int i = 0; i < 20; ++i) push_pull();
  std::printf("%-34s %10.3f\n", "GetStatus, Unix socket",
              MedianMs(7, 50, status));
  std::printf("%-34s %10.3f\n", "PushPull (N=1), Unix socket",
              MedianMs(7, 50, push_pull));
  stub = tcp_stub.get();
  WorkerPool* const calling_thread_only = nullptr;
  for (WorkerPool* threads : {calling_thread_only, &two_threads}) {
    for (int n : {1, 2, 4, 8}) {
      std::printf("server update alone (N=%d, %d thr)%*s %10.3f\n", n,
                  threads == nullptr ? 1 : threads->threads(), 2, "",
                  MedianMs(7, 50, apply(n, threads)));
    }
  }
  // In a job the update follows the workers' compute, which has evicted
  // the optimiser state from the caches: the same update with cold caches
  // (a 64 MB buffer written between updates, outside the timing).
  std::vector<char> evict(64 << 20);
  for (WorkerPool* threads : {calling_thread_only, &two_threads}) {
    std::vector<double> ms;
    auto update = apply(2, threads);
    for (int i = 0; i < 15; ++i) {
      std::memset(evict.data(), i, evict.size());
      const absl::Time t0 = absl::Now();
      update();
      ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
    }
    std::sort(ms.begin(), ms.end());
    std::printf("server update, cold caches (N=2, %d thr) %10.3f\n",
                threads == nullptr ? 1 : threads->threads(), ms[ms.size() / 2]);
  }
  coordinator.Shutdown();
  running->server->Shutdown();
  unix_running->server->Shutdown();
  return 0;
}

}  // namespace
}  // namespace dp

int main(int argc, char** argv) {
  dp::KeepLargeBuffersInHeap();
  if (argc == 2 && std::strncmp(argv[1], "--update_only", 13) == 0) {
    const char* threads = argv[1] + 13;
    return dp::UpdateOnly(*threads == '=' ? std::atoi(threads + 1) : 1);
  }
  if (argc > 1) {
    std::fprintf(stderr, "usage: exchange_bench [--update_only[=THREADS]]\n");
    return 2;
  }
  return dp::Main();
}
