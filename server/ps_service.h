// The gRPC face of dp-ps: maps dp.v1.ParameterServer requests onto a
// StepCoordinator. Uses the callback API so that requests waiting at the
// barrier hold no thread.
#ifndef DP_SERVER_PS_SERVICE_H_
#define DP_SERVER_PS_SERVICE_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "common/step_channel.h"
#include "proto/dp.grpc.pb.h"
#include "proto/security.h"
#include "server/request_validator.h"
#include "server/server_metrics.h"
#include "server/shared_plane.h"
#include "server/step_coordinator.h"

namespace dp {

struct PsServiceOptions {
  std::string auth_token;  // required on every call when not empty
  // Offered to workers that ask for it (not owned; null: none).
  SharedPlane* shared_memory = nullptr;
  // How long a step channel's thread spins before it parks.
  ChannelSpin step_spin;
  // Sharded jobs (Rollback): the steps this shard can restore besides 0,
  // and the state of one of them or of step 0. Unset: only step 0 is
  // restorable, and Rollback is UNIMPLEMENTED.
  std::function<std::vector<int64_t>()> restorable_steps;
  std::function<absl::StatusOr<TrainingState>(int64_t step)> restore;
  // Called once the coordinator went back to `step`, before the answer.
  // With the coordinator's generation after the rewind.
  std::function<void(int64_t step, uint64_t generation)> on_rewound;
  // Called when shard 0 says it has collected this shard's weights of
  // `step` (GetStatus with `collected`).
  std::function<void(int64_t step)> on_weights_collected;
  // Called on a step channel's thread as each request is read, before it
  // is served: for tests, what a gRPC interceptor is to a call.
  std::function<void(int rank, const ChannelRequest& request)>
      on_channel_request;
};

// The generated callback service, with the three calls that carry tensors
// (Pull, Push, PushPull) taking raw bytes so that tensor_message.h moves the
// tensors without protobuf's copies. The wire format is unchanged.
using ParameterServerBase = dp::v1::ParameterServer::WithCallbackMethod_Attend<
    dp::v1::ParameterServer::WithCallbackMethod_Register<
        dp::v1::ParameterServer::WithRawCallbackMethod_Pull<
            dp::v1::ParameterServer::WithRawCallbackMethod_Push<
                dp::v1::ParameterServer::WithCallbackMethod_Barrier<
                    dp::v1::ParameterServer::WithRawCallbackMethod_PushPull<
                        dp::v1::ParameterServer::WithCallbackMethod_ReportEval<
                            dp::v1::ParameterServer::
                                WithCallbackMethod_GetStatus<
                                    dp::v1::ParameterServer::
                                        WithCallbackMethod_Rollback<
                                            dp::v1::ParameterServer::
                                                Service>>>>>>>>>;

// RequestValidator over dp.v1 messages (the service's, the fuzzer's and the
// tests' one way to validate a request). A push's gradient may travel
// outside the message (tensor_message.h): then it is `gradient`.
absl::Status CheckRequest(const RequestValidator& v,
                          const dp::v1::RegisterRequest& r);
absl::Status CheckRequest(const RequestValidator& v,
                          const dp::v1::AttendRequest& r);
absl::Status CheckRequest(const RequestValidator& v,
                          const dp::v1::PullRequest& r);
absl::Status CheckRequest(const RequestValidator& v,
                          const dp::v1::PushRequest& r,
                          absl::string_view gradient);
inline absl::Status CheckRequest(const RequestValidator& v,
                                 const dp::v1::PushRequest& r) {
  return CheckRequest(v, r, r.gradient());
}
absl::Status CheckRequest(const RequestValidator& v,
                          const dp::v1::BarrierRequest& r);
absl::Status CheckRequest(const RequestValidator& v,
                          const dp::v1::ReportEvalRequest& r);
absl::Status CheckRequest(const RequestValidator& v,
                          const dp::v1::GetStatusRequest& r);
absl::Status CheckRequest(const RequestValidator& v,
                          const dp::v1::RollbackRequest& r);
// Registers as the request asks: its rank, or with any_rank the one dp-ps
// picks (the rank given is then the one preferred).
absl::StatusOr<StepCoordinator::Registration> RegisterAsRequested(
    StepCoordinator& coordinator, const dp::v1::RegisterRequest& r);

// Every handler first checks the call - token, then RequestValidator - and
// only then hands it to the coordinator: a refused call touches no state,
// and a rank counts as active (dp_ps_active_workers) only for calls the
// coordinator accepted.
class PsService final : public ParameterServerBase {
 public:
  // Its name for health checks.
  static constexpr char kServiceName[] = "dp.v1.ParameterServer";

  // Records requests, rejections, barrier waits and bytes in `metrics`
  // (not owned; null: in a private, unexported registry).
  explicit PsService(StepCoordinator* coordinator,
                     ServerMetrics* metrics = nullptr,
                     const PsServiceOptions& options = {});
  ~PsService() override;

  // Call before the server's Shutdown: ends the Attend streams (they
  // would hold Shutdown up until its deadline) and refuses new ones; their
  // ends are no departures (StepCoordinator::ConnectionClosed is not
  // called).
  void EndAttendance();

  grpc::ServerUnaryReactor* Register(
      grpc::CallbackServerContext* ctx, const dp::v1::RegisterRequest* request,
      dp::v1::RegisterResponse* response) override;
  // Held open until the worker goes (see the proto) or EndAttendance.
  grpc::ServerWriteReactor<dp::v1::AttendResponse>* Attend(
      grpc::CallbackServerContext* ctx,
      const dp::v1::AttendRequest* request) override;
  // PullRequest -> PullResponse
  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* ctx,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  // PushRequest -> PushResponse
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* ctx,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Barrier(grpc::CallbackServerContext* ctx,
                                    const dp::v1::BarrierRequest* request,
                                    dp::v1::BarrierResponse* response) override;
  // PushRequest -> PullResponse
  grpc::ServerUnaryReactor* PushPull(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ReportEval(
      grpc::CallbackServerContext* ctx,
      const dp::v1::ReportEvalRequest* request,
      dp::v1::ReportEvalResponse* response) override;
  grpc::ServerUnaryReactor* GetStatus(
      grpc::CallbackServerContext* ctx, const dp::v1::GetStatusRequest* request,
      dp::v1::GetStatusResponse* response) override;
  grpc::ServerUnaryReactor* Rollback(
      grpc::CallbackServerContext* ctx, const dp::v1::RollbackRequest* request,
      dp::v1::RollbackResponse* response) override;

 private:
  class AttendReactor;
  // The open Attend streams. A stream is owned here from its start to its
  // OnDone; EndAttendance finishes each outside the lock (gRPC may run
  // OnDone inline), holding its own reference.
  struct Attendance {
    absl::Mutex mu;
    std::map<const AttendReactor*, std::shared_ptr<AttendReactor>> open
        ABSL_GUARDED_BY(mu);
    bool ended ABSL_GUARDED_BY(mu) = false;
  };

  // Where this shard stands: its range, generation and restorable steps.
  void DescribeShard(const CoordinatorStatus& s, dp::v1::ShardInfo* out) const;
  // The push half of Push and PushPull: parses and checks the request, and
  // hands the gradient to the coordinator (an idle one has none: only
  // checked). *request gets the fields of the
  // request but its gradient.
  absl::StatusOr<StepCoordinator::PushResult> ReceivePush(
      const grpc::CallbackServerContext* ctx, const grpc::ByteBuffer& bytes,
      dp::v1::PushRequest* request);
  // ReceivePush once the caller is known to be allowed (the token, or a
  // step channel's page): the checks and the coordinator's push of
  // `request` with `gradient` (empty: in the rank's slot, or idle).
  absl::StatusOr<StepCoordinator::PushResult> ReceiveCheckedPush(
      const dp::v1::PushRequest& request, absl::string_view gradient);
  // A request posted through `rank`'s step channel (registration `slot_id`):
  // PushPull's push and wait, answered with the weights in shared memory.
  void ServeStepChannel(int rank, uint64_t slot_id,
                        const ChannelRequest& request,
                        StepChannels::Answer answer);
  // Finishes the call once `step` is applied (a barrier wait, observed as
  // such): with respond(new step)'s status, which fills the response.
  // Or, when the rank is handed work at it first, with respond(current
  // step, work).
  grpc::ServerUnaryReactor* AwaitStep(
      int rank, int64_t step,
      std::function<absl::Status(int64_t, Block)> respond);
  // The response to `rank`'s pull of [offset, offset + length) of
  // `version` (the current one when unset; length 0: to the end of the
  // range): in shared memory when it asks for that and the region can hold
  // them - this shard's whole range of the current version -, else in the
  // message.
  absl::StatusOr<grpc::ByteBuffer> RespondWithWeights(
      int rank, int64_t offset, int64_t length, std::optional<int64_t> version,
      bool in_shared_memory);
  // Writes this shard's whole range of the current version in shared memory
  // (once a version: SharedPlane::Publish) and returns the version.
  // ABORTED, publishing nothing, when `version` is set and not the current
  // one.
  absl::StatusOr<StepCoordinator::Version> PublishInSharedMemory(
      int rank, std::optional<int64_t> version);
  // A step channel's answer that PublishInSharedMemory(rank, version) put
  // the weights there: their version, the block `rank` computes next, and
  // whether the job is done.
  absl::StatusOr<ChannelResponse> WeightsAnswer(int rank,
                                                std::optional<int64_t> version);
  // The PullResponse for the weights of version `step` at `offset`: saying
  // they are in shared memory when `sent` is null, else sending sent's bytes
  // from their memory.
  // `block` is what the rank computes from them.
  grpc::ByteBuffer SerializeWeights(
      int64_t step, Block block, int64_t offset,
      const StepCoordinator::PulledWeights* sent) const;
  // A PullResponse without weights: compute `work` of step `step`.
  grpc::ByteBuffer SerializeWork(int64_t step, Block work) const;
  // Finishes a unary call with `s`; a refusal is counted in
  // dp_ps_rejected_requests_total, an accepted call of `rank` (>= 0) marks
  // the rank active.
  grpc::ServerUnaryReactor* FinishCall(grpc::CallbackServerContext* ctx,
                                       const absl::Status& s, int rank = -1);
  // UNAUTHENTICATED without the right token; the validator's verdict
  // otherwise.
  template <typename Request, typename... Tensor>
  absl::Status CheckCall(const grpc::CallbackServerContext* ctx,
                         const Request& request,
                         const Tensor&... tensor) const {
    if (absl::Status s = token_.Check(ctx->client_metadata()); !s.ok()) {
      return s;
    }
    return CheckRequest(validator_, request, tensor...);
  }

  StepCoordinator* const coordinator_;
  std::unique_ptr<ServerMetrics> own_metrics_;
  ServerMetrics* const metrics_;
  const TokenChecker token_;
  const RequestValidator validator_;
  SharedPlane* const shared_;
  const std::function<std::vector<int64_t>()> restorable_steps_;
  const std::function<absl::StatusOr<TrainingState>(int64_t)> restore_;
  const std::function<void(int64_t, uint64_t)> on_rewound_;
  const std::function<void(int64_t)> on_weights_collected_;
  const std::function<void(int, const ChannelRequest&)> on_channel_request_;
  const Encoding weight_encoding_;  // the job's, fixed
  Attendance attendance_;
};

}  // namespace dp

#endif  // DP_SERVER_PS_SERVICE_H_
