// dp.v1.ParameterServer over a StepCoordinator; no math here.
#include "server/ps_service.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "proto/grpc_status.h"
#include "proto/tensor_message.h"
#include "proto/wire.h"

namespace dp {
namespace {

using grpc::CallbackServerContext;
using grpc::ServerUnaryReactor;

// A call that completes when the coordinator applies a step. The barrier
// callback and a client cancellation race; whoever wins finishes the call,
// exactly once. Two references keep the reactor alive: gRPC's (dropped in
// OnDone) and Start's, since the step may be applied on another thread, and
// the call finished, before Start returns.
class StepWaitReactor final : public ServerUnaryReactor {
 public:
  // on_applied runs before Finish, with the new step (or the current one
  // and the work handed to the rank), to fill the response.
  StepWaitReactor(StepCoordinator* coordinator, ServerMetrics* metrics,
                  std::function<absl::Status(int64_t, Block)> on_applied)
      : coordinator_(coordinator),
        metrics_(metrics),
        on_applied_(std::move(on_applied)) {}

  void Start(int rank, int64_t step) {
    auto ticket = coordinator_->WaitForStep(
        rank, step,
        [this](const absl::Status& s, int64_t new_step, Block work) {
          FinishOnce(s.ok() ? on_applied_(new_step, work) : s);
        });
    if (!ticket.ok()) {
      FinishOnce(ticket.status());
      Unref();
      return;
    }
    metrics_->SawRank(rank);  // a waiting rank is active
    if (ticket->ready) {
      FinishOnce(on_applied_(ticket->step, ticket->work));
    } else {
      wait_id_.store(ticket->id);
      // A cancellation that came before the id was known could not remove
      // the wait; honour it now.
      if (cancelled_.load() && coordinator_->CancelWait(ticket->id)) {
        FinishOnce(absl::CancelledError("the client cancelled the wait"));
      }
    }
    Unref();
  }

  void OnCancel() override {
    cancelled_.store(true);
    const int64_t id = wait_id_.load();
    if (id > 0 && coordinator_->CancelWait(id)) {
      FinishOnce(absl::CancelledError("the client cancelled the wait"));
    }
  }
  void OnDone() override { Unref(); }

 private:
  void FinishOnce(const absl::Status& s) {
    if (finished_.exchange(true)) return;
    metrics_->CountRejected(s.code());
    Finish(ToGrpcStatus(s));
  }
  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  StepCoordinator* const coordinator_;
  ServerMetrics* const metrics_;
  const std::function<absl::Status(int64_t, Block)> on_applied_;
  std::atomic<int> refs_{2};
  std::atomic<int64_t> wait_id_{0};
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> finished_{false};
};

}  // namespace

absl::Status CheckRequest(const RequestValidator& v,
                          const dp::v1::RegisterRequest& r) {
  const DataFingerprint data{r.data().num_samples(), r.data().hash()};
  // With any_rank the rank is dp-ps's to pick: the one given means nothing.
  return v.CheckRegister(r.any_rank() ? 0 : r.rank(), r.model_fingerprint(),
                         r.has_data() ? &data : nullptr, r.worker_id());
}

absl::StatusOr<StepCoordinator::Registration> RegisterAsRequested(
    StepCoordinator& coordinator, const dp::v1::RegisterRequest& r) {
  const DataFingerprint data{r.data().num_samples(), r.data().hash()};
  return coordinator.Register(
      r.any_rank() ? StepCoordinator::kAnyRank : r.rank(),
      r.model_fingerprint(), data, r.worker_id(), r.any_rank() ? r.rank() : -1);
}

absl::Status CheckRequest(const RequestValidator& v,
                          const dp::v1::AttendRequest& r) {
  return v.CheckAttend(r.rank(), r.session());
}

absl::Status CheckRequest(const RequestValidator& v,
                          const dp::v1::PullRequest& r) {
  return v.CheckPull(r.rank(), r.offset(), r.length());
}

absl::Status CheckRequest(const RequestValidator& v,
                          const dp::v1::PushRequest& r,
                          absl::string_view gradient) {
  return v.CheckPush(r.rank(), r.step(), r.offset(),
                     static_cast<int>(r.encoding()), gradient.size(), r.loss(),
                     r.num_samples());
}

absl::Status CheckRequest(const RequestValidator& v,
                          const dp::v1::BarrierRequest& r) {
  return v.CheckBarrier(r.rank(), r.step());
}

absl::Status CheckRequest(const RequestValidator& v,
                          const dp::v1::ReportEvalRequest& r) {
  return v.CheckEval(r.rank(), FromProto(r));
}

absl::Status CheckRequest(const RequestValidator&,
                          const dp::v1::GetStatusRequest&) {
  return absl::OkStatus();
}

absl::Status CheckRequest(const RequestValidator&,
                          const dp::v1::RollbackRequest& r) {
  if (r.step() < 0 || r.step() > kMaxStep) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Rollback: step %d is out of range [0, %d]", r.step(), kMaxStep));
  }
  return absl::OkStatus();
}

PsService::PsService(StepCoordinator* coordinator, ServerMetrics* metrics,
                     const PsServiceOptions& options)
    : coordinator_(coordinator),
      own_metrics_(metrics != nullptr
                       ? nullptr
                       : std::make_unique<ServerMetrics>(
                             coordinator->Status().config.schedule.world_size,
                             /*shard=*/0,
                             coordinator->Status().config.min_workers)),
      metrics_(metrics != nullptr ? metrics : own_metrics_.get()),
      token_(options.auth_token),
      validator_(coordinator->Status().config.schedule.world_size,
                 coordinator->layout(), coordinator->shard().range),
      shared_(options.shared_memory),
      restorable_steps_(options.restorable_steps),
      restore_(options.restore),
      on_rewound_(options.on_rewound),
      on_weights_collected_(options.on_weights_collected),
      on_channel_request_(options.on_channel_request),
      weight_encoding_(coordinator->Status().config.weight_encoding) {
  if (shared_ != nullptr) {
    // Each version goes into shared memory as the update makes it, not in
    // a second pass at the first answer.
    coordinator_->SetUpdateSink(
        [plane = shared_](int64_t step,
                          absl::FunctionRef<void(EncodedCopy)> update) {
          plane->PublishAsMade(step, update);
        });
    shared_->ServeSteps(
        [this](int rank, uint64_t slot_id, const ChannelRequest& request,
               StepChannels::Answer answer) {
          ServeStepChannel(rank, slot_id, request, std::move(answer));
        },
        options.step_spin);
  }
}

PsService::~PsService() {
  // The channels' threads call this service; the coordinator may outlive
  // it and the plane.
  if (shared_ != nullptr) {
    shared_->StopSteps();
    coordinator_->SetUpdateSink(nullptr);
  }
}

void PsService::DescribeShard(const CoordinatorStatus& s,
                              dp::v1::ShardInfo* out) const {
  ShardState shard{s.shard, s.step, s.generation, s.holds_previous, {0}};
  if (restorable_steps_) {
    for (int64_t step : restorable_steps_()) {
      if (step != 0) shard.restorable_steps.push_back(step);
    }
  }
  ToProto(shard, out);
}

ServerUnaryReactor* PsService::FinishCall(CallbackServerContext* ctx,
                                          const absl::Status& s, int rank) {
  metrics_->CountRejected(s.code());
  if (s.ok() && rank >= 0) metrics_->SawRank(rank);
  ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

ServerUnaryReactor* PsService::AwaitStep(
    int rank, int64_t step,
    std::function<absl::Status(int64_t, Block)> respond) {
  const absl::Time arrived = absl::Now();
  auto* reactor = new StepWaitReactor(
      coordinator_, metrics_,
      [this, rank, arrived, respond = std::move(respond)](int64_t applied,
                                                          Block work) {
        metrics_->ObserveBarrierWait(rank, absl::Now() - arrived);
        return respond(applied, work);
      });
  reactor->Start(rank, step);
  return reactor;
}

ServerUnaryReactor* PsService::Register(CallbackServerContext* ctx,
                                        const dp::v1::RegisterRequest* request,
                                        dp::v1::RegisterResponse* response) {
  if (absl::Status s = CheckCall(ctx, *request); !s.ok())
    return FinishCall(ctx, s);
  auto reg = RegisterAsRequested(*coordinator_, *request);
  if (!reg.ok()) return FinishCall(ctx, reg.status());
  const int rank = reg->rank;
  response->set_rank(rank);
  response->set_session(reg->session);
  ToProto(reg->config, response->mutable_config());
  response->set_step(reg->step);
  response->set_total_steps(reg->config.schedule.total_steps());
  response->set_steps_per_epoch(reg->config.schedule.steps_per_epoch());
  response->set_num_params(coordinator_->layout().num_params());
  DescribeShard(coordinator_->Status(), response->mutable_shard());
  if (request->shared_memory() && shared_ != nullptr) {
    // Without an offer the worker uses gRPC: not an error.
    absl::StatusOr<SharedPlane::Offer> offer = shared_->OfferTo(rank);
    if (offer.ok()) {
      response->set_shm_socket(offer->socket);
      response->set_shm_ticket(offer->ticket);
      response->set_shm_slot(offer->slot_id);
    } else {
      Log("rank %d: no shared memory: %s", rank, offer.status().message());
    }
  }
  return FinishCall(ctx, absl::OkStatus(), rank);
}

// An Attend stream: sends nothing, and ends when the worker's connection
// closes or it cancels (OnCancel: a departure), or at EndAttendance.
class PsService::AttendReactor final
    : public grpc::ServerWriteReactor<dp::v1::AttendResponse> {
 public:
  AttendReactor(PsService* service, int rank, uint64_t session)
      : service_(service), rank_(rank), session_(session) {}

  void OnCancel() override {
    // Not after EndAttendance: dp-ps going away is nobody's departure.
    if (!finished_.exchange(true)) {
      service_->coordinator_->ConnectionClosed(rank_, session_);
      Finish(grpc::Status::CANCELLED);
    }
  }
  void OnDone() override {
    std::shared_ptr<AttendReactor> self;  // may be the last reference
    absl::MutexLock lock(&service_->attendance_.mu);
    auto it = service_->attendance_.open.find(this);
    if (it == service_->attendance_.open.end()) return;
    self = std::move(it->second);
    service_->attendance_.open.erase(it);
  }
  void FinishOnce(const absl::Status& s) {
    if (!finished_.exchange(true)) Finish(ToGrpcStatus(s));
  }

 private:
  PsService* const service_;
  const int rank_;
  const uint64_t session_;
  std::atomic<bool> finished_{false};
};

grpc::ServerWriteReactor<dp::v1::AttendResponse>* PsService::Attend(
    CallbackServerContext* ctx, const dp::v1::AttendRequest* request) {
  auto reactor = std::make_shared<AttendReactor>(this, request->rank(),
                                                 request->session());
  bool ended = false;
  {
    absl::MutexLock lock(&attendance_.mu);
    attendance_.open.emplace(reactor.get(), reactor);
    ended = attendance_.ended;
  }
  absl::Status s = CheckCall(ctx, *request);
  if (s.ok() && ended) s = absl::UnavailableError("dp-ps is shutting down");
  if (s.ok()) s = coordinator_->Attend(request->rank(), request->session());
  metrics_->CountRejected(s.code());
  if (s.ok()) {
    reactor->StartSendInitialMetadata();  // tells the worker it attends
  } else {
    reactor->FinishOnce(s);
  }
  return reactor.get();
}

void PsService::EndAttendance() {
  std::vector<std::shared_ptr<AttendReactor>> open;
  {
    absl::MutexLock lock(&attendance_.mu);
    attendance_.ended = true;
    for (const auto& [_, reactor] : attendance_.open) open.push_back(reactor);
  }
  for (const auto& reactor : open) reactor->FinishOnce(absl::OkStatus());
}

absl::StatusOr<StepCoordinator::Version> PsService::PublishInSharedMemory(
    int rank, std::optional<int64_t> version) {
  // The region is written straight from the params, encoded on the way,
  // with no snapshot between (a gRPC response still makes one when it
  // needs it). Under the coordinator's lock, for one pass, as Pull's
  // encode was; the plane never calls the coordinator, so the two locks
  // cannot deadlock.
  return coordinator_->WithCurrentWeights(
      rank,
      [this](int64_t step, absl::Span<const float> params) {
        shared_->Publish(step, params);
      },
      version);
}

absl::StatusOr<ChannelResponse> PsService::WeightsAnswer(
    int rank, std::optional<int64_t> version) {
  ASSIGN_OR_RETURN(const StepCoordinator::Version v,
                   PublishInSharedMemory(rank, version));
  ChannelResponse response;
  response.step = v.step;
  response.block_first = v.block.first;
  response.block_count = v.block.count;
  response.done = coordinator_->done();
  return response;
}

absl::StatusOr<grpc::ByteBuffer> PsService::RespondWithWeights(
    int rank, int64_t offset, int64_t length, std::optional<int64_t> version,
    bool in_shared_memory) {
  // Shared memory holds this shard's whole range of the current version
  // only: a version asked for by number goes there when it is the current
  // one (a follower shard's usual case), else in the message.
  const ParamRange range = coordinator_->shard().range;
  if (in_shared_memory && shared_ != nullptr && offset == range.offset &&
      (length == 0 || length == range.length)) {
    absl::StatusOr<StepCoordinator::Version> v =
        PublishInSharedMemory(rank, version);
    if (v.ok()) return SerializeWeights(v->step, v->block, offset, nullptr);
    if (!version.has_value() ||
        v.status().code() != absl::StatusCode::kAborted) {
      return v.status();
    }
  }
  ASSIGN_OR_RETURN(const StepCoordinator::PulledWeights weights,
                   coordinator_->Pull(rank, offset, length, version));
  return SerializeWeights(weights.step, weights.block, offset, &weights);
}

grpc::ByteBuffer PsService::SerializeWork(int64_t step, Block work) const {
  dp::v1::PullResponse header;
  header.set_step(step);
  header.set_encoding(ToProto(weight_encoding_));
  header.set_work_only(true);
  ToProto(work, header.mutable_block());
  grpc::ByteBuffer bytes = SerializeMessage(header);
  metrics_->AddSentBytes(bytes.Length());
  return bytes;
}

grpc::ByteBuffer PsService::SerializeWeights(
    int64_t step, Block block, int64_t offset,
    const StepCoordinator::PulledWeights* sent) const {
  dp::v1::PullResponse header;
  header.set_step(step);
  header.set_offset(offset);
  if (!block.empty()) ToProto(block, header.mutable_block());
  header.set_done(coordinator_->done());
  header.set_encoding(ToProto(weight_encoding_));
  header.set_params_in_shm(sent == nullptr);
  grpc::ByteBuffer bytes =
      sent == nullptr ? SerializeMessage(header)
                      : SerializeWithTensor(
                            header, dp::v1::PullResponse::kParamsFieldNumber,
                            sent->bytes, sent->lease);
  metrics_->AddSentBytes(bytes.Length());
  return bytes;
}

ServerUnaryReactor* PsService::Pull(CallbackServerContext* ctx,
                                    const grpc::ByteBuffer* bytes,
                                    grpc::ByteBuffer* response) {
  dp::v1::PullRequest request;
  if (absl::Status s = ParseMessage(*bytes, &request); !s.ok()) {
    return FinishCall(ctx, s);
  }
  if (absl::Status s = CheckCall(ctx, request); !s.ok())
    return FinishCall(ctx, s);
  std::optional<int64_t> version;
  if (request.has_version()) version = request.version();
  absl::StatusOr<grpc::ByteBuffer> weights =
      RespondWithWeights(request.rank(), request.offset(), request.length(),
                         version, request.weights_in_shm());
  if (!weights.ok()) return FinishCall(ctx, weights.status());
  *response = *std::move(weights);
  return FinishCall(ctx, absl::OkStatus(), request.rank());
}

absl::StatusOr<StepCoordinator::PushResult> PsService::ReceivePush(
    const CallbackServerContext* ctx, const grpc::ByteBuffer& bytes,
    dp::v1::PushRequest* request) {
  ReceivedTensor tensor;
  RETURN_IF_ERROR(ParseWithTensor(
      bytes, dp::v1::PushRequest::kGradientFieldNumber, request, &tensor));
  // The token first: a stranger learns nothing about ranks or slots.
  RETURN_IF_ERROR(token_.Check(ctx->client_metadata()));
  // One buffer per gRPC thread, reused by every call it serves: the
  // gradient is copied out of it before the handler returns.
  thread_local std::string scratch;
  absl::StatusOr<StepCoordinator::PushResult> pushed =
      ReceiveCheckedPush(*request, tensor.Contiguous(&scratch));
  if (pushed.ok() && !request->idle()) {
    metrics_->AddReceivedBytes(bytes.Length());
  }
  return pushed;
}

absl::StatusOr<StepCoordinator::PushResult> PsService::ReceiveCheckedPush(
    const dp::v1::PushRequest& request, absl::string_view gradient) {
  if (request.idle()) {
    if (!gradient.empty() || request.gradient_in_shm()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "Push from rank %d says it is idle and carries a gradient",
          request.rank()));
    }
    dp::v1::BarrierRequest wait;
    wait.set_rank(request.rank());
    wait.set_step(request.step());
    RETURN_IF_ERROR(CheckRequest(validator_, wait));
    return StepCoordinator::PushResult{request.step(), false};
  }
  // A gradient in the rank's slot is read in place - once, by the
  // coordinator, into its own memory - and the slot kept alive (a new
  // registration of the rank replaces it) until then. The slot must be the
  // one this process of the rank was given: an older process of the rank
  // still holds its own, and is refused.
  std::shared_ptr<const SharedRegion> slot;
  if (request.gradient_in_shm()) {
    if (!gradient.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "Push from rank %d carries a gradient and says it is in shared "
          "memory",
          request.rank()));
    }
    if (shared_ == nullptr) {
      return absl::FailedPreconditionError(
          "this dp-ps offers no shared memory (--shared_memory=false)");
    }
    ASSIGN_OR_RETURN(slot, shared_->Slot(request.rank(), request.shm_slot()));
    gradient = absl::string_view(slot->data(), slot->size());
  }
  RETURN_IF_ERROR(CheckRequest(validator_, request, gradient));
  const Block block = FromProto(request.block());
  absl::StatusOr<StepCoordinator::PushResult> pushed = coordinator_->Push(
      request.rank(), request.step(), request.offset(), gradient,
      request.loss(), FromProto(request.encoding()), block);
  if (pushed.ok()) metrics_->SawRank(request.rank());
  return pushed;
}

void PsService::ServeStepChannel(int rank, uint64_t slot_id,
                                 const ChannelRequest& r,
                                 StepChannels::Answer answer) {
  if (on_channel_request_) on_channel_request_(rank, r);
  auto refuse = [this, answer](const absl::Status& s) {
    metrics_->CountRejected(s.code());
    ChannelResponse response;
    response.code = s.code();
    response.message = std::string(s.message());
    answer(response);
  };
  auto accept = [this, answer](const ChannelResponse& response) {
    metrics_->CountRejected(absl::StatusCode::kOk);
    answer(response);
  };
  switch (r.kind) {
    case ChannelKind::kPushPull:
    case ChannelKind::kPush:
      break;
    case ChannelKind::kPull: {
      // Pull with a version, the weights in shared memory. Any other
      // version than the current one goes over gRPC, which can send the
      // one before in a message.
      absl::StatusOr<ChannelResponse> weights = WeightsAnswer(rank, r.step);
      if (!weights.ok()) return refuse(weights.status());
      metrics_->SawRank(rank);
      return accept(*weights);
    }
    default:
      return refuse(absl::InvalidArgumentError(absl::StrFormat(
          "rank %d's step channel: request kind %d is none of PushPull (0), "
          "Push (1), Pull (2)",
          rank, static_cast<int32_t>(r.kind))));
  }
  // The request as the call would have it: the gradient in the rank's
  // slot, the weights back in shared memory. The page was handed over for
  // a registration that passed the token; holding it is the credential, as
  // holding the slot is.
  dp::v1::PushRequest request;
  request.set_rank(rank);
  request.set_step(r.step);
  request.set_offset(coordinator_->shard().range.offset);
  request.set_loss(r.loss);
  request.set_num_samples(r.num_samples);
  request.set_encoding(static_cast<dp::v1::Encoding>(r.encoding));
  request.set_idle(r.idle);
  request.set_gradient_in_shm(!r.idle);
  request.set_shm_slot(slot_id);
  if (r.block_count != 0) {
    request.mutable_block()->set_first(r.block_first);
    request.mutable_block()->set_count(r.block_count);
  }
  absl::StatusOr<StepCoordinator::PushResult> pushed =
      ReceiveCheckedPush(request, {});
  if (!pushed.ok()) return refuse(pushed.status());
  if (r.kind == ChannelKind::kPush) {
    ChannelResponse response;
    response.step = pushed->step;
    return accept(response);
  }
  const absl::Time arrived = absl::Now();
  // Filled on whichever thread the step is applied (or work handed) on.
  auto respond = [this, rank, arrived, accept, refuse](int64_t step,
                                                       Block work) {
    metrics_->ObserveBarrierWait(rank, absl::Now() - arrived);
    if (work.empty()) {
      absl::StatusOr<ChannelResponse> weights =
          WeightsAnswer(rank, std::nullopt);
      if (!weights.ok()) return refuse(weights.status());
      return accept(*weights);
    }
    ChannelResponse response;
    response.step = step;
    response.work_only = true;
    response.block_first = work.first;
    response.block_count = work.count;
    accept(response);
  };
  absl::StatusOr<StepCoordinator::WaitTicket> ticket =
      coordinator_->WaitForStep(
          rank, r.step,
          [respond, refuse](const absl::Status& s, int64_t step, Block work) {
            if (s.ok()) return respond(step, work);
            refuse(s);
          });
  if (!ticket.ok()) return refuse(ticket.status());
  metrics_->SawRank(rank);  // a waiting rank is active
  if (ticket->ready) respond(ticket->step, ticket->work);
}

ServerUnaryReactor* PsService::Push(CallbackServerContext* ctx,
                                    const grpc::ByteBuffer* bytes,
                                    grpc::ByteBuffer* response) {
  dp::v1::PushRequest request;
  auto result = ReceivePush(ctx, *bytes, &request);
  if (!result.ok()) return FinishCall(ctx, result.status());
  dp::v1::PushResponse header;
  header.set_step(result->step);
  header.set_duplicate(result->duplicate);
  *response = SerializeMessage(header);
  return FinishCall(ctx, absl::OkStatus());  // ReceivePush marked the rank
}

ServerUnaryReactor* PsService::Barrier(CallbackServerContext* ctx,
                                       const dp::v1::BarrierRequest* request,
                                       dp::v1::BarrierResponse* response) {
  if (absl::Status s = CheckCall(ctx, *request); !s.ok())
    return FinishCall(ctx, s);
  return AwaitStep(request->rank(), request->step(),
                   [this, response](int64_t step, Block work) {
                     response->set_step(step);
                     response->set_done(coordinator_->done());
                     if (!work.empty()) {
                       ToProto(work, response->mutable_block());
                     }
                     return absl::OkStatus();
                   });
}

ServerUnaryReactor* PsService::PushPull(CallbackServerContext* ctx,
                                        const grpc::ByteBuffer* bytes,
                                        grpc::ByteBuffer* response) {
  dp::v1::PushRequest request;
  // An idle rank pushes nothing and waits: for the step, or for work.
  auto pushed = ReceivePush(ctx, *bytes, &request);
  if (!pushed.ok()) return FinishCall(ctx, pushed.status());
  const int rank = request.rank();
  const bool in_shm = request.weights_in_shm();
  return AwaitStep(
      rank, request.step(),
      [this, response, rank, in_shm](int64_t step, Block work) -> absl::Status {
        if (!work.empty()) {
          *response = SerializeWork(step, work);
          return absl::OkStatus();
        }
        ASSIGN_OR_RETURN(
            *response,
            RespondWithWeights(rank, coordinator_->shard().range.offset, 0,
                               std::nullopt, in_shm));
        return absl::OkStatus();
      });
}

ServerUnaryReactor* PsService::ReportEval(
    CallbackServerContext* ctx, const dp::v1::ReportEvalRequest* request,
    dp::v1::ReportEvalResponse* /*response*/) {
  if (absl::Status s = CheckCall(ctx, *request); !s.ok())
    return FinishCall(ctx, s);
  return FinishCall(
      ctx, coordinator_->RecordEval(request->rank(), FromProto(*request)),
      request->rank());
}

ServerUnaryReactor* PsService::GetStatus(
    CallbackServerContext* ctx, const dp::v1::GetStatusRequest* request,
    dp::v1::GetStatusResponse* response) {
  if (absl::Status s = CheckCall(ctx, *request); !s.ok())
    return FinishCall(ctx, s);
  CoordinatorStatus s = coordinator_->Status();
  ToProto(s.config, response->mutable_config());
  response->set_step(s.step);
  response->set_total_steps(s.total_steps);
  if (s.total_steps > 0) {
    response->set_epoch(s.config.schedule.epoch_of(s.step));
  }
  for (int r : s.registered_ranks) response->add_registered_ranks(r);
  for (int r : s.pushed_ranks) response->add_pushed_ranks(r);
  for (int r : s.waits_for) response->add_waits_for(r);
  response->set_done(s.done);
  response->set_last_test_accuracy(s.last_eval.accuracy);
  response->set_last_loss(s.last_loss);
  DescribeShard(s, response->mutable_shard());
  if (request->with_params()) {
    // The float32 values themselves, of the version reported above.
    const TrainingState state = coordinator_->Snapshot();
    response->set_step(state.step);
    response->set_params(state.params.data(),
                         state.params.size() * sizeof(float));
  }
  // Only once shard 0 has the weights: the reply above may still be lost.
  if (request->has_collected() && on_weights_collected_) {
    on_weights_collected_(request->collected());
  }
  return FinishCall(ctx, absl::OkStatus());
}

ServerUnaryReactor* PsService::Rollback(CallbackServerContext* ctx,
                                        const dp::v1::RollbackRequest* request,
                                        dp::v1::RollbackResponse* response) {
  if (absl::Status s = CheckCall(ctx, *request); !s.ok())
    return FinishCall(ctx, s);
  if (!restore_) {
    return FinishCall(ctx, absl::UnimplementedError(
                               "this dp-ps cannot roll back (not a shard)"));
  }
  const CoordinatorStatus before = coordinator_->Status();
  const int64_t step = request->step();
  if (step != before.step) {
    std::vector<int64_t> steps =
        restorable_steps_ ? restorable_steps_() : std::vector<int64_t>{};
    if (step != 0 &&
        std::find(steps.begin(), steps.end(), step) == steps.end()) {
      // ABORTED: the checkpoint may have gone since the caller looked
      // (retention); it decides again on what the shard says now.
      return FinishCall(ctx,
                        absl::AbortedError(absl::StrFormat(
                            "Rollback: %s cannot restore step %d (it is at "
                            "step %d and has no checkpoint of it)",
                            before.shard.ToString(), step, before.step)));
    }
    absl::StatusOr<TrainingState> state = restore_(step);
    if (!state.ok()) {
      return FinishCall(ctx, absl::AbortedError(absl::StrCat(
                                 "Rollback: ", state.status().message())));
    }
    if (absl::Status s =
            coordinator_->Rewind(request->generation(), *std::move(state));
        !s.ok()) {
      return FinishCall(ctx, s);
    }
    if (on_rewound_) on_rewound_(step, coordinator_->Status().generation);
  }
  const CoordinatorStatus after = coordinator_->Status();
  response->set_step(after.step);
  DescribeShard(after, response->mutable_shard());
  return FinishCall(ctx, absl::OkStatus());
}

}  // namespace dp
