// The worker's view of dp-ps: one method per RPC in plain C++ types (the
// dp.v1 messages stay inside ps_client.cc), every call with a deadline,
// UNAVAILABLE (dp-ps starting or restarting) and a call cancelled by dp-ps
// (draining) retried with exponential backoff and jitter, errors as
// absl::Status with the server's message.
#ifndef DP_WORKER_PS_CLIENT_H_
#define DP_WORKER_PS_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/dataset.h"
#include "common/job_config.h"
#include "common/lent_buffer.h"
#include "common/micro_batch_tree.h"
#include "common/shard_plan.h"
#include "common/shared_memory.h"
#include "common/step_channel.h"
#include "common/tensor_codec.h"

namespace dp {

// How tensors travel: gRPC always works; shared memory when dp-ps is on
// this host (in this network namespace) and offers it.
enum class DataPlane { kAuto, kGrpc, kShm };

struct PsClientOptions {
  std::string address = "localhost:5000";
  absl::Duration call_timeout = absl::Seconds(30);
  // A barrier or fused push-pull waits for the slowest worker; when this
  // passes the trainer reports whom it waits for and waits again.
  absl::Duration wait_timeout = absl::Seconds(30);
  // How long UNAVAILABLE is retried before giving up.
  absl::Duration retry_for = absl::Seconds(120);
  int max_message_bytes = 4 << 20;
  // TLS or plaintext (proto/security.h); null means plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  std::string tls_server_name;  // verify this name instead of the host's
  std::string auth_token;       // sent with every call when not empty
  // kAuto: shared memory when offered and reachable, else gRPC; kShm: an
  // error (FAILED_PRECONDITION) when it is not.
  DataPlane data_plane = DataPlane::kAuto;
  // With shared memory: each step's push and wait through the step
  // channel's page (common/step_channel.h) instead of a PushPull call.
  bool step_channel = true;
  ChannelSpin step_spin;  // how long a wait spins before it parks
};

// Where a dp-ps stands among the job's shards, as it last answered.
struct JobStatus {
  JobConfig config;
  int64_t step = 0;
  std::vector<int> pushed_ranks;  // ranks whose push for `step` arrived
  std::vector<int> waits_for;     // ranks whose block of `step` is not in
  ShardState shard;
  int rank = 0;  // Register: the rank this worker is
};

// What a worker asks to register as (dp-ps answers with the job and its
// rank; StepCoordinator::Registration is that answer): dp-ps refuses a
// worker whose model or data differ.
struct RegistrationRequest {
  int rank = 0;
  bool any_rank = false;  // dp-ps picks the rank, `rank` if it is free
  uint64_t model_fingerprint = 0;
  DataFingerprint data;
  // host/pid: names this process to dp-ps, in its logs and as the holder
  // of its rank (docs/elastic.md: a second process of a rank).
  std::string worker_id;
};

// What Pull and PushPull receive.
struct Weights {
  int64_t step = 0;  // the version
  // The whole vector, but for the tensors read in place in shared memory
  // (their values here are left as they were). Keeps its capacity from call
  // to call.
  std::vector<float> params;
  // Where each tensor of the layout (ModelLayout::tensors()) lies: in a
  // dp-ps's shared memory, or in params.
  std::vector<absl::Span<const float>> tensors;
  bool in_place = false;   // some tensor lies in shared memory
  int64_t wire_bytes = 0;  // size of the message(s)
  // What this worker computes from them (empty: nothing yet: it waits
  // idle). With work_only, no weights came: the block is more work for
  // `step`, whose weights (params, tensors) are as they were.
  Block block;
  bool work_only = false;
};

// What one dp-ps's answer held besides the values it writes into its range
// of the whole vector.
struct Received {
  int64_t step = 0;
  int64_t wire_bytes = 0;
  // Values [in_place_offset, in_place_offset + in_place.size()) of the whole
  // vector, read in place in shared memory instead of written into it: the
  // tensors wholly inside the range (float32 weights only).
  absl::Span<const float> in_place;
  int64_t in_place_offset = 0;
  Block block;             // see Weights
  bool work_only = false;  // no values: nothing was written or read
};

// One step's gradient, in `encoding`: the whole vector in `wire`, of which
// each dp-ps gets its range, without a copy over gRPC (it is InUse() until
// gRPC lets go of it) or copied into its shared-memory slot; or, with
// in_shared_memory, already in this rank's slot (PsClient::GradientSlot,
// one dp-ps only).
struct Gradient {
  int rank = 0;
  int64_t step = 0;
  float loss = 0.0f;
  int num_samples = 0;
  Encoding encoding = Encoding::kF32;
  const LentBuffer* wire = nullptr;
  bool in_shared_memory = false;
  // The micro-batches it is the sum of (empty: micro-batch `rank`).
  Block block;
  // Nothing to push: PushPull waits for the step (or for work) only.
  bool idle = false;
};

// One dp-ps (one shard of the job's parameters): worker/ps_group.h speaks
// to all of them.
class PsClient {
 public:
  explicit PsClient(const PsClientOptions& options);
  ~PsClient();

  absl::StatusOr<JobStatus> GetStatus();
  // The plan of the job as it is now, the step it is at and where this
  // dp-ps stands among the shards. Takes the shared memory dp-ps offers (a
  // fresh slot every time), as data_plane says. Then attends: holds a call
  // open that tells dp-ps at once when this process goes.
  absl::StatusOr<JobStatus> Register(const RegistrationRequest& registration);
  // Ends the Attend call of the last registration: dp-ps counts the rank
  // gone, free for another process, as when this one's connection closes.
  void EndAttendance();
  // Sets the shard back to `step` if it is still at `generation`.
  absl::StatusOr<ShardState> Rollback(int64_t step, uint64_t generation);
  // As of the last Register.
  const ShardSpec& shard() const { return shard_; }
  // Since the last Register: tensors go through shared memory. Else why
  // not ("" when gRPC was asked for).
  bool shared_memory() const { return slot_ != nullptr; }
  // Since the last Register: steps go through the step channel, while it
  // works.
  bool step_channel() const { return channel_ != nullptr; }
  const std::string& why_not_shared_memory() const { return why_not_shm_; }
  // This rank's gradient slot (empty without shared memory): the trainer
  // writes the encoded gradient here and pushes with in_shared_memory.
  absl::Span<char> GradientSlot() const;
  // The weights of this shard's range, of the current version or of
  // `version`, into their place in `all` (the whole vector); float32 weights
  // in shared memory are read in place instead (Received::in_place), but
  // for the pieces of tensors that other shards hold the rest of.
  absl::Status Pull(int rank, std::optional<int64_t> version,
                    absl::Span<float> all, Received* received);
  // Push, Barrier and Pull; or PushPull: push, wait at the barrier, receive
  // the new weights. Each returns the bytes it sent in *sent_bytes. With a
  // step channel, Push, PushPull and a Pull of a given version go through
  // it instead of a call (a Pull of another version than dp-ps's current
  // one is then asked again over gRPC).
  absl::Status Push(const Gradient& gradient, int64_t* sent_bytes);
  // *work: empty once `step` is applied; else a block of it to compute.
  absl::Status Barrier(int rank, int64_t step, Block* work);
  absl::Status PushPull(const Gradient& gradient, absl::Span<float> all,
                        Received* received, int64_t* sent_bytes);
  absl::Status ReportEval(int rank, const EvalReport& report);
  // After computing from weights read in place: ABORTED when their buffer
  // no longer holds the version it held (rewritten under the computation),
  // so that a gradient of no version is never pushed.
  absl::Status CheckInPlaceWeights() const;

  const std::string& address() const { return options_.address; }

 private:
  // Runs `call(context)` with a fresh context and deadline until it returns
  // anything but UNAVAILABLE or CANCELLED (which it returns as UNAVAILABLE),
  // or retry_for has passed.
  template <typename Call>
  absl::Status WithRetry(const char* what, absl::Duration timeout, Call call);
  // WithRetry of a call of the generated stub: (stub->*method)(context,
  // request, response).
  template <typename Method, typename Request, typename Response>
  absl::Status StubCall(const char* what, absl::Duration timeout, Method method,
                        const Request& request, Response* response);

  // A call whose messages are raw bytes (Pull, Push, PushPull), so that
  // tensors skip protobuf's copies: the blocking call generated stubs make,
  // with the ByteBuffer codec instead of the protobuf one.
  enum class Raw { kPull, kPush, kPushPull };
  absl::Status RawCall(Raw method, absl::Duration timeout,
                       const grpc::ByteBuffer& request,
                       grpc::ByteBuffer* response);
  // Puts this shard's range of the gradient into the slot when there is
  // one (unless it is there already); true when it is there.
  bool PlaceInSlot(const Gradient& gradient);
  // The step channel's request that pushes `gradient` from the slot (or,
  // idle, nothing) as `kind`.
  static ChannelRequest ChannelPush(const Gradient& gradient, ChannelKind kind);
  // `request` through the step channel, the answer or its error; nullopt
  // when there is no channel, or no longer: dp-ps went away under the wait
  // (UNAVAILABLE), and the caller makes the call over gRPC instead.
  std::optional<absl::StatusOr<ChannelResponse>> OverChannel(
      const ChannelRequest& request, absl::Duration timeout);
  // The channel's answer of weights (or of more work) into `all`.
  absl::Status FromChannel(const ChannelResponse& answer, absl::Span<float> all,
                           Received* received);
  // A Push or PushPull request: naming the slot (in_slot), or carrying this
  // shard's range of gradient.wire without a copy.
  grpc::ByteBuffer SerializePush(const Gradient& gradient, bool in_slot) const;
  // Parses a PullResponse into this shard's range of `all`.
  absl::Status ReadWeights(const grpc::ByteBuffer& response,
                           absl::Span<float> all, Received* received);
  // Version `step` in shared memory: float32 read in place, but for the
  // pieces of tensors shared with another shard, copied into `all`;
  // another encoding decoded into `all`.
  absl::Status ReadSharedWeights(int64_t step, absl::Span<float> all,
                                 Received* received);

  // The generated stub and the raw methods (ps_client.cc).
  struct Rpc;
  // The Attend call of the current registration, open while it lasts
  // (ps_client.cc).
  class Attendance;

  // One registration; a refused ticket is PERMISSION_DENIED unless
  // last_try (then it is as any other failure to take the memory).
  absl::StatusOr<JobStatus> RegisterOnce(
      const RegistrationRequest& registration, bool last_try);

  // Maps the regions dp-ps offered in `response` (RegisterResponse).
  absl::Status TakeSharedMemory(const std::string& socket,
                                const std::string& ticket,
                                const JobConfig& config, int64_t num_params);

  PsClientOptions options_;
  std::unique_ptr<Rpc> rpc_;
  std::unique_ptr<Attendance> attendance_;  // before rpc_ goes
  int64_t num_params_ = 0;                  // of the whole vector
  ShardSpec shard_;
  ParamRange whole_tensors_;                   // of shard_.range (WholeTensors)
  std::unique_ptr<SharedRegion> weights_;      // read-only
  Encoding weight_encoding_ = Encoding::kF32;  // of weights_
  // The weights last read in place, while they are.
  std::optional<SharedWeights> in_place_;
  std::unique_ptr<SharedRegion> slot_;
  uint64_t slot_id_ = 0;  // dp-ps's name for slot_, sent with every push
  // The step channel of this registration (with slot_), while it works.
  std::unique_ptr<SharedRegion> channel_page_;
  std::unique_ptr<ChannelClient> channel_;
  std::string why_not_shm_;
  std::string scratch_;  // received weights that need decoding
};

}  // namespace dp

#endif  // DP_WORKER_PS_CLIENT_H_
