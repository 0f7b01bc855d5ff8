// The gRPC face of dp-ps: maps dp.v1.ParameterServer requests onto a
// StepCoordinator. Uses the callback API so that requests waiting at the
// barrier hold no thread.
#ifndef DP_SERVER_PS_SERVICE_H_
#define DP_SERVER_PS_SERVICE_H_

#include <memory>
#include <string>

#include "common/metrics.h"
#include "common/security.h"
#include "proto/dp.grpc.pb.h"
#include "server/request_validator.h"
#include "server/step_coordinator.h"

namespace dp {

struct PsServiceOptions {
  std::string auth_token;  // required on every call when not empty
};

// Every handler first admits the call - token, then RequestValidator - and
// only then hands it to the coordinator: a refused call touches no state.
class PsService final : public dp::v1::ParameterServer::CallbackService {
 public:
  // Records requests, rejections, barrier waits and bytes in `metrics`
  // (not owned; null: in a private, unexported registry).
  explicit PsService(StepCoordinator* coordinator,
                     ServerMetrics* metrics = nullptr,
                     const PsServiceOptions& options = {});

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
  // UNAUTHENTICATED without the right token; the validator's verdict
  // otherwise.
  template <typename Request>
  absl::Status Admit(const grpc::CallbackServerContext* ctx,
                     const Request& request) const {
    if (absl::Status s = token_.Check(ctx->client_metadata()); !s.ok()) {
      return s;
    }
    return validator_.Check(request);
  }

  StepCoordinator* const coordinator_;
  std::unique_ptr<ServerMetrics> own_metrics_;
  ServerMetrics* const metrics_;
  const TokenChecker token_;
  const RequestValidator validator_;
};

}  // namespace dp

#endif  // DP_SERVER_PS_SERVICE_H_
