// The gRPC face of dp-ps: maps dp.v1.ParameterServer requests onto a
// StepCoordinator. Uses the callback API so that requests waiting at the
// barrier hold no thread.
#ifndef DP_SERVER_PS_SERVICE_H_
#define DP_SERVER_PS_SERVICE_H_

#include "proto/dp.grpc.pb.h"
#include "server/request_validator.h"
#include "server/step_coordinator.h"

namespace dp {

// Every handler first admits the call (RequestValidator) and only then hands
// it to the coordinator: a refused call touches no state.
class PsService final : public dp::v1::ParameterServer::CallbackService {
 public:
  explicit PsService(StepCoordinator* coordinator);

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
  // The validator's verdict.
  template <typename Request>
  absl::Status Admit(const grpc::CallbackServerContext* /*ctx*/,
                     const Request& request) const {
    return validator_.Check(request);
  }

  StepCoordinator* const coordinator_;
  const RequestValidator validator_;
};

}  // namespace dp

#endif  // DP_SERVER_PS_SERVICE_H_
