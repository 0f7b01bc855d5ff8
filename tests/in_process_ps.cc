// A PsService on loopback gRPC, in the test's own process.
#include "tests/in_process_ps.h"

#include "absl/strings/str_cat.h"
#include "common/shard_plan.h"
#include "common/status_macros.h"
#include "proto/grpc_server.h"
#include "tests/coordinator_harness.h"

namespace dp {
namespace {

// Runs `hook` as each call's request headers arrive (before the handler).
class BeforeCall : public grpc::experimental::Interceptor {
 public:
  BeforeCall(const std::function<void(const std::string&)>* hook,
             std::string method)
      : hook_(hook), method_(std::move(method)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* m) override {
    if (m->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::
                POST_RECV_INITIAL_METADATA)) {
      (*hook_)(method_);
    }
    m->Proceed();
  }

 private:
  const std::function<void(const std::string&)>* const hook_;
  const std::string method_;
};

class BeforeCallFactory
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit BeforeCallFactory(const std::function<void(const std::string&)>* h)
      : hook_(h) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new BeforeCall(hook_, info->method());
  }

 private:
  const std::function<void(const std::string&)>* const hook_;
};

std::string ChannelMethod(ChannelKind kind) {
  switch (kind) {
    case ChannelKind::kPushPull:
      return "step channel /dp.v1.ParameterServer/PushPull";
    case ChannelKind::kPush:
      return "step channel /dp.v1.ParameterServer/Push";
    case ChannelKind::kPull:
      return "step channel /dp.v1.ParameterServer/Pull";
  }
  return "step channel: unknown";
}

}  // namespace

absl::StatusOr<std::unique_ptr<InProcessPs>> InProcessPs::Start(
    const InProcessPsOptions& options) {
  std::unique_ptr<InProcessPs> ps(new InProcessPs());
  CoordinatorSetup setup;
  setup.job = TestJob(options.world_size);
  setup.job.schedule.batch_size = 8;
  setup.job.schedule.max_steps = options.max_steps;
  setup.job.weight_encoding = options.weight_encoding;
  setup.init_seed = 3;
  setup.registered = 0;  // the tests' clients register
  RETURN_IF_ERROR(
      MakeShardSpec(ps->layout_, options.shards, options.shard, &setup.shard));
  ps->coordinator_ = MakeTestCoordinator(ps->layout_, setup);
  if (ServerMetrics* metrics = options.metrics) {
    ps->coordinator_->SetUpdateObserver(
        [metrics](absl::Duration d) { metrics->ObserveUpdate(d); });
  }
  if (options.shared_memory) {
    ASSIGN_OR_RETURN(
        ps->shared_,
        SharedPlane::Start(options.world_size, setup.shard.range.length,
                           Encoding::kF32, options.weight_encoding));
  }
  PsServiceOptions service_options{"", ps->shared_.get()};
  if (options.shards > 1) {
    service_options.restore =
        [initial = ps->coordinator_->Snapshot()](
            int64_t step) -> absl::StatusOr<TrainingState> {
      if (step != 0) return absl::NotFoundError("no checkpoints");
      return initial;
    };
  }
  if (options.before_call) {
    // A step channel's request as the call it stands for, so that a hook
    // on a method sees it whichever way it came.
    service_options.on_channel_request = [hook = &ps->before_call_](
                                             int, const ChannelRequest& r) {
      (*hook)(ChannelMethod(r.kind));
    };
  }
  ps->service_ = std::make_unique<PsService>(ps->coordinator_.get(),
                                             options.metrics, service_options);
  GrpcServerOptions server_options;
  server_options.address = "127.0.0.1:0";
  server_options.ready = options.ready;
  server_options.max_message_bytes = MessageBytesFor(ps->layout_.num_params());
  if (options.before_call) {
    ps->before_call_ = options.before_call;
    server_options.interceptors = [hook = &ps->before_call_] {
      GrpcServerOptions::Interceptors made;
      made.push_back(std::make_unique<BeforeCallFactory>(hook));
      return made;
    };
  }
  ASSIGN_OR_RETURN(RunningServer running,
                   StartGrpcServer(server_options, {ps->service_.get()}));
  ps->server_ = std::move(running.server);
  ps->address_ = absl::StrCat("127.0.0.1:", running.port);
  ps->stub_ = dp::v1::ParameterServer::NewStub(grpc::CreateCustomChannel(
      ps->address_, grpc::InsecureChannelCredentials(),
      ClientChannelArguments(options.client_max_message_bytes > 0
                                 ? options.client_max_message_bytes
                                 : server_options.max_message_bytes)));
  return ps;
}

InProcessPs::~InProcessPs() {
  if (coordinator_) coordinator_->Shutdown();
  if (service_) service_->EndAttendance();
  if (server_) server_->Shutdown();
}

}  // namespace dp
