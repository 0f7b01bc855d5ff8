// The gRPC face of dp-ps: maps dp.v1.ParameterServer requests onto a
// StepCoordinator. Uses the callback API so that requests waiting at the
// barrier hold no thread.
#ifndef DP_SERVER_PS_SERVICE_H_
#define DP_SERVER_PS_SERVICE_H_

#include <memory>

#include "common/metrics.h"
#include "proto/dp.grpc.pb.h"
#include "server/step_coordinator.h"

namespace dp {

class PsService final : public dp::v1::ParameterServer::CallbackService {
 public:
  // Records requests, rejections, barrier waits and bytes in `metrics`
  // (not owned; null: in a private, unexported registry).
  explicit PsService(StepCoordinator* coordinator,
                     ServerMetrics* metrics = nullptr);

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx,
                                     const dp::v1::RegisterRequest* request,
                                     dp::v1::RegisterResponse* response) override;
  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* ctx,
                                 const dp::v1::PullRequest* request,
                                 dp::v1::PullResponse* response) override;
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* ctx,
                                 const dp::v1::PushRequest* request,
                                 dp::v1::PushResponse* response) override;
  grpc::ServerUnaryReactor* Barrier(grpc::CallbackServerContext* ctx,
                                    const dp::v1::BarrierRequest* request,
                                    dp::v1::BarrierResponse* response) override;
  grpc::ServerUnaryReactor* PushPull(grpc::CallbackServerContext* ctx,
                                     const dp::v1::PushRequest* request,
                                     dp::v1::PullResponse* response) override;
  grpc::ServerUnaryReactor* ReportEval(
      grpc::CallbackServerContext* ctx,
      const dp::v1::ReportEvalRequest* request,
      dp::v1::ReportEvalResponse* response) override;
  grpc::ServerUnaryReactor* GetStatus(
      grpc::CallbackServerContext* ctx,
      const dp::v1::GetStatusRequest* request,
      dp::v1::GetStatusResponse* response) override;

 private:
  // The push half of Push and PushPull: records the request, hands the
  // gradient to the coordinator.
  absl::StatusOr<StepCoordinator::PushResult> Deliver(
      const dp::v1::PushRequest& request);
  // Finishes a unary call with the status of a synchronous operation.
  grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx,
                                 const absl::Status& s);

  StepCoordinator* const coordinator_;
  std::unique_ptr<ServerMetrics> own_metrics_;
  ServerMetrics* const metrics_;
};

}  // namespace dp

#endif  // DP_SERVER_PS_SERVICE_H_
