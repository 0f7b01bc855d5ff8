// gRPC client of dp-ps with deadlines and backoff.
#include "worker/ps_client.h"

#include <grpcpp/impl/client_unary_call.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/model_layout.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "proto/dp.grpc.pb.h"
#include "proto/grpc_server.h"
#include "proto/grpc_status.h"
#include "proto/security.h"
#include "proto/tensor_message.h"
#include "proto/wire.h"
#include "worker/backend.h"
#include "worker/exit_code.h"

namespace dp {

namespace {

std::shared_ptr<grpc::Channel> MakeChannel(const PsClientOptions& options) {
  return ClientChannel(options.address, options.max_message_bytes,
                       options.credentials, options.tls_server_name);
}

// The full names of the raw calls, as the generated stub spells them (a
// typo shows as UNIMPLEMENTED in every job test).
constexpr char kPullMethod[] = "/dp.v1.ParameterServer/Pull";
constexpr char kPushMethod[] = "/dp.v1.ParameterServer/Push";
constexpr char kPushPullMethod[] = "/dp.v1.ParameterServer/PushPull";

JobStatus JobStatusFromProto(const dp::v1::JobConfig& config, int64_t step,
                             const dp::v1::ShardInfo& shard,
                             int64_t num_params) {
  JobStatus status;
  status.config = FromProto(config);
  status.step = step;
  status.shard = FromProto(shard, step, num_params);
  return status;
}

}  // namespace

struct PsClient::Rpc {
  explicit Rpc(std::shared_ptr<grpc::Channel> c)
      : channel(std::move(c)),
        stub(dp::v1::ParameterServer::NewStub(channel)),
        pull(kPullMethod, grpc::internal::RpcMethod::NORMAL_RPC, channel),
        push(kPushMethod, grpc::internal::RpcMethod::NORMAL_RPC, channel),
        push_pull(kPushPullMethod, grpc::internal::RpcMethod::NORMAL_RPC,
                  channel) {}
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<dp::v1::ParameterServer::Stub> stub;
  const grpc::internal::RpcMethod pull;
  const grpc::internal::RpcMethod push;
  const grpc::internal::RpcMethod push_pull;
};

// Holds an Attend call open: when this process goes, its connection closes
// and dp-ps learns of it at once. Nothing is read but the call's end: dp-ps
// ending it (shutdown, or another registration of the rank) is no error,
// and the next registration attends again.
class PsClient::Attendance final
    : public grpc::ClientReadReactor<dp::v1::AttendResponse> {
 public:
  Attendance(dp::v1::ParameterServer::Stub* stub, const std::string& token,
             int rank, uint64_t session) {
    request_.set_rank(rank);
    request_.set_session(session);
    AttachToken(token, &context_);
    stub->async()->Attend(&context_, &request_, this);
    StartRead(&response_);
    StartCall();
  }
  // Cancelling tells dp-ps that this registration is over.
  ~Attendance() override {
    context_.TryCancel();
    done_.WaitForNotification();
  }

  void OnReadDone(bool ok) override {
    if (ok) StartRead(&response_);
  }
  void OnDone(const grpc::Status&) override {
    {
      absl::MutexLock lock(&mu_);
      ended_ = true;
      if (channel_ != nullptr) channel_->Close();
    }
    done_.Notify();
  }
  // `channel`'s waits end once this call does: dp-ps ended it (it shuts
  // down, or another process took the rank) or its connection is gone.
  void CloseOnEnd(ChannelClient* channel) {
    absl::MutexLock lock(&mu_);
    channel_ = channel;  // null: none any more
    if (ended_ && channel_ != nullptr) channel_->Close();
  }

 private:
  absl::Mutex mu_;
  ChannelClient* channel_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext context_;
  dp::v1::AttendRequest request_;
  dp::v1::AttendResponse response_;
  absl::Notification done_;
};

PsClient::PsClient(const PsClientOptions& options)
    : options_(options), rpc_(std::make_unique<Rpc>(MakeChannel(options_))) {
  // Until a registration says otherwise: one dp-ps holding the whole model.
  num_params_ = ModelLayout::SimpleNet().num_params();
  shard_.range = ParamRange{0, num_params_};
  whole_tensors_ = shard_.range;
}

PsClient::~PsClient() { attendance_.reset(); }

absl::Status PsClient::RawCall(Raw method, absl::Duration timeout,
                               const grpc::ByteBuffer& request,
                               grpc::ByteBuffer* response) {
  const grpc::internal::RpcMethod& m = method == Raw::kPull   ? rpc_->pull
                                       : method == Raw::kPush ? rpc_->push
                                                              : rpc_->push_pull;
  const char* what = method == Raw::kPull   ? "Pull"
                     : method == Raw::kPush ? "Push"
                                            : "PushPull";
  return WithRetry(what, timeout, [&](grpc::ClientContext* c) {
    return grpc::internal::BlockingUnaryCall<grpc::ByteBuffer,
                                             grpc::ByteBuffer>(
        rpc_->channel.get(), m, c, request, response);
  });
}

bool PsClient::PlaceInSlot(const Gradient& gradient) {
  if (gradient.idle) return false;
  if (gradient.in_shared_memory) return true;
  if (slot_ == nullptr) return false;
  // dp-ps has read the slot's last gradient before it answered.
  const size_t width = BytesPerValue(gradient.encoding);
  std::memcpy(slot_->data(),
              gradient.wire->data() + shard_.range.offset * width,
              shard_.range.length * width);
  return true;
}

grpc::ByteBuffer PsClient::SerializePush(const Gradient& gradient,
                                         bool in_slot) const {
  dp::v1::PushRequest header;
  header.set_rank(gradient.rank);
  header.set_step(gradient.step);
  header.set_offset(shard_.range.offset);
  header.set_loss(gradient.loss);
  header.set_num_samples(gradient.num_samples);
  header.set_encoding(ToProto(gradient.encoding));
  header.set_weights_in_shm(shared_memory());
  if (!gradient.block.empty()) ToProto(gradient.block, header.mutable_block());
  if (gradient.idle) {
    header.set_idle(true);
    return SerializeMessage(header);
  }
  if (in_slot) {
    header.set_gradient_in_shm(true);
    header.set_shm_slot(slot_id_);
    return SerializeMessage(header);
  }
  const size_t width = BytesPerValue(gradient.encoding);
  const absl::string_view range = gradient.wire->view().substr(
      shard_.range.offset * width, shard_.range.length * width);
  return SerializeWithTensor(header, dp::v1::PushRequest::kGradientFieldNumber,
                             range, gradient.wire->Lend());
}

absl::Status PsClient::ReadWeights(const grpc::ByteBuffer& response,
                                   absl::Span<float> all, Received* received) {
  ReceivedTensor params;
  dp::v1::PullResponse header;
  RETURN_IF_ERROR(ParseWithTensor(
      response, dp::v1::PullResponse::kParamsFieldNumber, &header, &params));
  if (static_cast<int64_t>(all.size()) < shard_.range.end() ||
      header.offset() != shard_.range.offset) {
    return absl::DataLossError(absl::StrFormat(
        "dp-ps at %s sent weights at offset %d; it owns [%d, %d) of %d",
        options_.address, header.offset(), shard_.range.offset,
        shard_.range.end(), all.size()));
  }
  const absl::Span<float> out =
      all.subspan(shard_.range.offset, shard_.range.length);
  received->step = header.step();
  received->wire_bytes = static_cast<int64_t>(response.Length());
  received->block = FromProto(header.block());
  received->work_only = header.work_only();
  // More work on the weights held: in place ones stay read.
  if (header.work_only()) return absl::OkStatus();
  received->in_place = {};
  in_place_.reset();
  if (header.params_in_shm()) {
    if (weights_ == nullptr) {
      return absl::DataLossError(
          "dp-ps answered with weights in shared memory this worker does "
          "not have");
    }
    return ReadSharedWeights(header.step(), all, received);
  }
  const dp::v1::Encoding e = header.encoding();
  if (e != dp::v1::ENCODING_F32 && e != dp::v1::ENCODING_BF16) {
    return absl::DataLossError(
        absl::StrFormat("dp-ps at %s sent weights in an unknown encoding %d",
                        options_.address, static_cast<int>(e)));
  }
  const Encoding encoding = FromProto(e);
  const size_t width = BytesPerValue(encoding);
  if (params.size() != out.size() * width) {
    return absl::DataLossError(absl::StrFormat(
        "dp-ps at %s sent %d bytes of weights; its range holds %d %s values",
        options_.address, params.size(), out.size(), EncodingName(encoding)));
  }
  if (encoding == Encoding::kF32) {
    params.CopyTo(reinterpret_cast<char*>(out.data()));
  } else {
    // A value may straddle two received slices: decode from one piece.
    Decode(encoding, params.Contiguous(&scratch_).data(), out.size(),
           out.data());
  }
  return absl::OkStatus();
}

absl::Status PsClient::ReadSharedWeights(int64_t step, absl::Span<float> all,
                                         Received* received) {
  const absl::Span<float> out =
      all.subspan(shard_.range.offset, shard_.range.length);
  if (weight_encoding_ != Encoding::kF32) {
    return dp::ReadWeights(*weights_, step, out);
  }
  ASSIGN_OR_RETURN(const SharedWeights found,
                   FindWeights(*weights_, step, shard_.range.length));
  if (found.encoding != Encoding::kF32) {
    return absl::DataLossError(absl::StrFormat(
        "dp-ps at %s published its weights in %s; the job's are f32",
        options_.address, EncodingName(found.encoding)));
  }
  // The pieces of the tensors cut by the range's ends are copied, so that
  // those tensors are whole in `all` once the other shards wrote theirs.
  // They come from the buffer CheckInPlaceWeights checks, like the rest.
  const float* values = reinterpret_cast<const float*>(found.values);
  const int64_t head = whole_tensors_.offset - shard_.range.offset;
  const int64_t tail = whole_tensors_.end() - shard_.range.offset;
  std::copy(values, values + head, out.begin());
  std::copy(values + tail, values + shard_.range.length, out.begin() + tail);
  received->in_place =
      absl::MakeConstSpan(values + head, whole_tensors_.length);
  received->in_place_offset = whole_tensors_.offset;
  in_place_ = found;
  return absl::OkStatus();
}

absl::Status PsClient::CheckInPlaceWeights() const {
  if (!in_place_.has_value() || StillHolds(*weights_, *in_place_)) {
    return absl::OkStatus();
  }
  return absl::AbortedError(absl::StrFormat(
      "the weights of version %d in the shared memory of dp-ps at %s were "
      "rewritten while this worker computed from them: the gradient is "
      "dropped; re-sync",
      in_place_->step, options_.address));
}

namespace {

// The worker never cancels its own calls, so a CANCELLED comes from dp-ps:
// a draining dp-ps (SIGTERM, a Kubernetes eviction) cancels the calls still
// in flight when its grace period ends, including one that a retry after
// "dp-ps is shutting down" sent to it again. It is the same event as that
// UNAVAILABLE, and is retried the same way: a worker that exited on it
// would be a failed pod, charged to the Job's backoffLimit.
absl::Status DrainAsUnavailable(absl::Status s) {
  if (s.code() != absl::StatusCode::kCancelled) return s;
  return absl::UnavailableError(
      absl::StrCat("dp-ps cancelled the call, as it does when it shuts down (",
                   s.message(), ")"));
}

}  // namespace

template <typename Call>
absl::Status PsClient::WithRetry(const char* what, absl::Duration timeout,
                                 Call call) {
  const absl::Time give_up = absl::Now() + options_.retry_for;
  absl::Duration backoff = absl::Milliseconds(50);
  std::minstd_rand jitter(std::random_device{}());
  absl::Status s;
  for (int attempt = 1;; ++attempt) {
    grpc::ClientContext context;
    const absl::Time sent = absl::Now();
    absl::Time deadline = sent + timeout;
    if (attempt > 1) {
      // dp-ps was unavailable: wait for the channel to connect rather than
      // fail at once. gRPC keeps a channel that failed to connect failing
      // fast until a connection succeeds, and a call that fails at once
      // abandons the connection attempt it started: restarted dp-ps shards
      // were left unreached for seconds.
      context.set_wait_for_ready(true);
      deadline = std::min(deadline, give_up);
    }
    context.set_deadline(absl::ToChronoTime(deadline));
    AttachToken(options_.auth_token, &context);
    absl::Status result = DrainAsUnavailable(FromGrpcStatus(call(&context)));
    // A retry whose deadline passed while the channel never got a
    // connection waited for dp-ps, not for a step: it is still unavailable.
    // (Taken for a barrier's deadline, it made the caller wait again and
    // again, past --retry_for_s, for a dp-ps that was gone.)
    if (attempt > 1 && result.code() == absl::StatusCode::kDeadlineExceeded &&
        rpc_->channel->GetState(/*try_to_connect=*/false) !=
            GRPC_CHANNEL_READY) {
      // The wait that passed, which give_up may have cut shorter than
      // `timeout`.
      result = absl::UnavailableError(
          absl::StrFormat("no connection within %s",
                          absl::FormatDuration(absl::Trunc(
                              deadline - sent, absl::Milliseconds(1)))));
    }
    const bool gave_up = attempt > 1 &&
                         result.code() == absl::StatusCode::kDeadlineExceeded &&
                         absl::Now() >= give_up;
    // The last UNAVAILABLE says why; a wait cut short by give_up does not.
    if (!gave_up) s = std::move(result);
    if (!gave_up && s.code() != absl::StatusCode::kUnavailable) return s;
    if (gave_up || absl::Now() + backoff > give_up) {
      return PsUnreachableError(absl::StrFormat(
          "dp-ps at %s is unavailable for %s after %d attempts over %s: %s "
          "(when dp-ps is up, this is also how a TLS mismatch shows: "
          "plaintext against TLS, or a certificate the other side refuses; "
          "compare --tls_ca, --tls_cert and --tls_key of both)",
          options_.address, what, attempt,
          absl::FormatDuration(options_.retry_for), s.message()));
    }
    if (attempt == 1 || attempt % 10 == 0) {
      Log("dp-ps at %s unavailable (%s), retrying %s", options_.address,
          s.message(), what);
    }
    // Full jitter keeps restarted workers from reconnecting in lockstep.
    const double factor =
        std::uniform_real_distribution<double>(0.5, 1.0)(jitter);
    absl::SleepFor(backoff * factor);
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
}

template <typename Method, typename Request, typename Response>
absl::Status PsClient::StubCall(const char* what, absl::Duration timeout,
                                Method method, const Request& request,
                                Response* response) {
  return WithRetry(what, timeout, [&](grpc::ClientContext* c) {
    return (rpc_->stub.get()->*method)(c, request, response);
  });
}

absl::StatusOr<JobStatus> PsClient::GetStatus() {
  dp::v1::GetStatusResponse response;
  dp::v1::GetStatusRequest request;
  RETURN_IF_ERROR(StubCall("GetStatus", options_.call_timeout,
                           &dp::v1::ParameterServer::Stub::GetStatus, request,
                           &response));
  JobStatus status = JobStatusFromProto(response.config(), response.step(),
                                        response.shard(), num_params_);
  status.pushed_ranks.assign(response.pushed_ranks().begin(),
                             response.pushed_ranks().end());
  status.waits_for.assign(response.waits_for().begin(),
                          response.waits_for().end());
  return status;
}

absl::StatusOr<JobStatus> PsClient::Register(
    const RegistrationRequest& registration) {
  // dp-ps withdraws a ticket not yet redeemed when another registration of
  // the rank comes in (another process, once dp-ps counted this one lost:
  // it was silent past its lease). This registration is then stale anyway,
  // as a push through its slot would say: registering again gets a fresh
  // ticket, or, while the other process holds the rank, RESOURCE_EXHAUSTED
  // (PsGroup stands by).
  constexpr int kTicketTries = 3;
  for (int attempt = 1;; ++attempt) {
    const bool last = attempt == kTicketTries;
    absl::StatusOr<JobStatus> status = RegisterOnce(registration, last);
    if (last || status.status().code() != absl::StatusCode::kPermissionDenied)
      return status;
  }
}

void PsClient::EndAttendance() { attendance_.reset(); }

absl::StatusOr<JobStatus> PsClient::RegisterOnce(
    const RegistrationRequest& registration, bool last_try) {
  dp::v1::RegisterRequest request;
  request.set_rank(registration.rank);
  request.set_any_rank(registration.any_rank);
  request.set_model_fingerprint(registration.model_fingerprint);
  request.mutable_data()->set_num_samples(registration.data.num_samples);
  request.mutable_data()->set_hash(registration.data.hash);
  request.set_worker_id(registration.worker_id);
  request.set_shared_memory(options_.data_plane != DataPlane::kGrpc);
  dp::v1::RegisterResponse response;
  RETURN_IF_ERROR(StubCall("Register", options_.call_timeout,
                           &dp::v1::ParameterServer::Stub::Register, request,
                           &response));
  num_params_ = response.num_params();
  JobStatus status = JobStatusFromProto(response.config(), response.step(),
                                        response.shard(), num_params_);
  status.rank = response.rank();
  // The previous registration's call ends (dp-ps ignores the end of a
  // session that is no longer the rank's), then this one's starts.
  attendance_.reset();
  ASSIGN_OR_RETURN(const ModelLayout layout, JobMlp(status.config));
  // The channel's limits were made for the default model: a larger one's
  // tensors need a channel with room for them (the attendance, on the old
  // channel, has ended).
  if (const int need = MessageBytesFor(layout.num_params());
      need > options_.max_message_bytes) {
    options_.max_message_bytes = need;
    rpc_ = std::make_unique<Rpc>(MakeChannel(options_));
  }
  if (response.session() != 0) {  // 0: none offered
    attendance_ = std::make_unique<Attendance>(
        rpc_->stub.get(), options_.auth_token, status.rank, response.session());
  }
  shard_ = status.shard.spec;
  whole_tensors_ = WholeTensors(layout, shard_.range);
  // The regions of a previous registration are dropped: dp-ps gave this
  // registration a new slot, and reads the old one no more.
  in_place_.reset();
  weights_.reset();
  slot_.reset();
  channel_.reset();
  channel_page_.reset();
  slot_id_ = response.shm_slot();
  why_not_shm_.clear();
  if (options_.data_plane == DataPlane::kGrpc) return status;
  absl::Status taken =
      response.shm_socket().empty()
          ? absl::FailedPreconditionError(
                "dp-ps offers no shared memory (--shared_memory=false, or it "
                "could not make any)")
          : TakeSharedMemory(response.shm_socket(), response.shm_ticket(),
                             status.config, shard_.range.length);
  if (taken.code() == absl::StatusCode::kPermissionDenied && !last_try) {
    return taken;
  }
  if (!taken.ok()) {
    if (options_.data_plane == DataPlane::kShm) {
      return absl::FailedPreconditionError(
          absl::StrCat("--data_plane=shm: ", taken.message()));
    }
    why_not_shm_ = std::string(taken.message());
  }
  return status;
}

absl::Status PsClient::TakeSharedMemory(const std::string& socket,
                                        const std::string& ticket,
                                        const JobConfig& config,
                                        int64_t num_params) {
  ASSIGN_OR_RETURN(std::vector<int> fds,
                   FetchSharedMemory(socket, ticket, /*count=*/3));
  absl::StatusOr<std::unique_ptr<SharedRegion>> weights = SharedRegion::Map(
      fds[0], WeightsRegionBytes(num_params, config.weight_encoding),
      /*writable=*/false);
  absl::StatusOr<std::unique_ptr<SharedRegion>> slot = SharedRegion::Map(
      fds[1], num_params * BytesPerValue(config.grad_encoding),
      /*writable=*/true);
  absl::StatusOr<std::unique_ptr<SharedRegion>> page =
      SharedRegion::Map(fds[2], kStepChannelBytes, /*writable=*/true);
  if (!weights.ok()) return weights.status();
  if (!slot.ok()) return slot.status();
  if (!page.ok()) return page.status();
  weights_ = *std::move(weights);
  weight_encoding_ = config.weight_encoding;
  slot_ = *std::move(slot);
  if (options_.step_channel) {
    channel_page_ = *std::move(page);
    channel_ = std::make_unique<ChannelClient>(channel_page_.get(),
                                               options_.step_spin);
    if (attendance_ != nullptr) attendance_->CloseOnEnd(channel_.get());
  }
  return absl::OkStatus();
}

absl::Span<char> PsClient::GradientSlot() const {
  if (slot_ == nullptr) return {};
  return absl::Span<char>(slot_->data(), slot_->size());
}

absl::StatusOr<ShardState> PsClient::Rollback(int64_t step,
                                              uint64_t generation) {
  dp::v1::RollbackRequest request;
  request.set_step(step);
  request.set_generation(generation);
  dp::v1::RollbackResponse response;
  RETURN_IF_ERROR(StubCall("Rollback", options_.call_timeout,
                           &dp::v1::ParameterServer::Stub::Rollback, request,
                           &response));
  return FromProto(response.shard(), response.step(), num_params_);
}

absl::Status PsClient::Pull(int rank, std::optional<int64_t> version,
                            absl::Span<float> all, Received* received) {
  if (version.has_value()) {
    ChannelRequest pull;
    pull.kind = ChannelKind::kPull;
    pull.step = *version;
    if (auto answer = OverChannel(pull, options_.call_timeout)) {
      if (answer->ok()) return FromChannel(**answer, all, received);
      // Any version but the current one is gRPC's to serve: the one
      // before, in a message, or the refusal.
      if (answer->status().code() != absl::StatusCode::kAborted) {
        return answer->status();
      }
    }
  }
  dp::v1::PullRequest request;
  request.set_rank(rank);
  request.set_offset(shard_.range.offset);
  if (version.has_value()) request.set_version(*version);
  request.set_weights_in_shm(shared_memory());
  grpc::ByteBuffer response;
  RETURN_IF_ERROR(RawCall(Raw::kPull, options_.call_timeout,
                          SerializeMessage(request), &response));
  return ReadWeights(response, all, received);
}

absl::Status PsClient::Push(const Gradient& gradient, int64_t* sent_bytes) {
  const bool in_slot = PlaceInSlot(gradient);
  if (in_slot || gradient.idle) {
    if (auto answer = OverChannel(ChannelPush(gradient, ChannelKind::kPush),
                                  options_.call_timeout)) {
      *sent_bytes = 0;
      return answer->status();
    }
  }
  const grpc::ByteBuffer request = SerializePush(gradient, in_slot);
  *sent_bytes = static_cast<int64_t>(request.Length());
  grpc::ByteBuffer bytes;
  RETURN_IF_ERROR(RawCall(Raw::kPush, options_.call_timeout, request, &bytes));
  dp::v1::PushResponse response;
  return ParseMessage(bytes, &response);
}

absl::Status PsClient::Barrier(int rank, int64_t step, Block* work) {
  dp::v1::BarrierRequest request;
  request.set_rank(rank);
  request.set_step(step);
  dp::v1::BarrierResponse response;
  RETURN_IF_ERROR(StubCall("Barrier", options_.wait_timeout,
                           &dp::v1::ParameterServer::Stub::Barrier, request,
                           &response));
  *work = FromProto(response.block());
  return absl::OkStatus();
}

absl::Status PsClient::PushPull(const Gradient& gradient, absl::Span<float> all,
                                Received* received, int64_t* sent_bytes) {
  const bool in_slot = PlaceInSlot(gradient);
  if (in_slot || gradient.idle) {
    if (auto answer = OverChannel(ChannelPush(gradient, ChannelKind::kPushPull),
                                  options_.wait_timeout)) {
      *sent_bytes = 0;
      RETURN_IF_ERROR(answer->status());
      return FromChannel(**answer, all, received);
    }
  }
  const grpc::ByteBuffer request = SerializePush(gradient, in_slot);
  *sent_bytes = static_cast<int64_t>(request.Length());
  grpc::ByteBuffer response;
  RETURN_IF_ERROR(
      RawCall(Raw::kPushPull, options_.wait_timeout, request, &response));
  return ReadWeights(response, all, received);
}

ChannelRequest PsClient::ChannelPush(const Gradient& gradient,
                                     ChannelKind kind) {
  ChannelRequest request;
  request.kind = kind;
  request.step = gradient.step;
  request.block_first = gradient.block.first;
  request.block_count = gradient.block.count;
  request.loss = gradient.loss;
  request.num_samples = gradient.num_samples;
  request.encoding = static_cast<int32_t>(ToProto(gradient.encoding));
  request.idle = gradient.idle;
  return request;
}

std::optional<absl::StatusOr<ChannelResponse>> PsClient::OverChannel(
    const ChannelRequest& request, absl::Duration timeout) {
  if (channel_ == nullptr) return std::nullopt;
  absl::StatusOr<ChannelResponse> answer = channel_->Call(request, timeout);
  if (answer.ok() && answer->code != absl::StatusCode::kOk) {
    answer = absl::Status(answer->code, answer->message);
  }
  if (answer.status().code() != absl::StatusCode::kUnavailable) {
    return answer;
  }
  // dp-ps went away under the wait: gRPC retries it, and tells whether
  // the dp-ps that answers knows this registration.
  if (attendance_ != nullptr) attendance_->CloseOnEnd(nullptr);
  channel_.reset();
  return std::nullopt;
}

absl::Status PsClient::FromChannel(const ChannelResponse& answer,
                                   absl::Span<float> all, Received* received) {
  received->step = answer.step;
  received->wire_bytes = 0;
  received->block = Block{answer.block_first, answer.block_count};
  received->work_only = answer.work_only;
  if (answer.work_only) return absl::OkStatus();
  received->in_place = {};
  in_place_.reset();
  return ReadSharedWeights(answer.step, all, received);
}

absl::Status PsClient::ReportEval(int rank, const EvalReport& report) {
  dp::v1::ReportEvalRequest request;
  request.set_rank(rank);
  ToProto(report, &request);
  dp::v1::ReportEvalResponse response;
  return StubCall("ReportEval", options_.call_timeout,
                  &dp::v1::ParameterServer::Stub::ReportEval, request,
                  &response);
}

}  // namespace dp
