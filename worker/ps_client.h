// The worker's view of dp-ps: one method per RPC in plain C++ types (the
// dp.v1 messages stay inside ps_client.cc), every call with a deadline,
// UNAVAILABLE retried with exponential backoff and jitter (dp-ps starting or
// restarting), errors as absl::Status with the server's message.
#ifndef DP_WORKER_PS_CLIENT_H_
#define DP_WORKER_PS_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/dataset.h"
#include "common/job_config.h"
#include "common/lent_buffer.h"
#include "common/shared_memory.h"
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
  // TLS or plaintext (common/security.h); null means plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  std::string tls_server_name;  // verify this name instead of the host's
  std::string auth_token;       // sent with every call when not empty
  // kAuto: shared memory when offered and reachable, else gRPC; kShm: an
  // error (FAILED_PRECONDITION) when it is not.
  DataPlane data_plane = DataPlane::kAuto;
};

struct JobStatus {
  JobConfig config;
  int64_t step = 0;
  std::vector<int> pushed_ranks;  // ranks whose push for `step` arrived
};

// Who registers: dp-ps refuses a worker whose model or data differ.
struct Registration {
  int rank = 0;
  uint64_t model_fingerprint = 0;
  DataFingerprint data;
  std::string worker_id;  // host/pid, for dp-ps's logs
};

// What Pull and PushPull receive.
struct Weights {
  int64_t step = 0;           // the version
  std::vector<float> params;  // keeps its capacity from call to call
  int64_t wire_bytes = 0;     // size of the message
};

// One step's gradient, in `encoding`: in `wire`, sent without a copy (it is
// InUse() until gRPC lets go of it), or, with in_shared_memory, already in
// this rank's slot (PsClient::GradientSlot).
struct Gradient {
  int rank = 0;
  int64_t step = 0;
  float loss = 0.0f;
  int num_samples = 0;
  Encoding encoding = Encoding::kF32;
  const LentBuffer* wire = nullptr;
  bool in_shared_memory = false;
};

class PsClient {
 public:
  explicit PsClient(const PsClientOptions& options);
  ~PsClient();

  absl::StatusOr<JobStatus> GetStatus();
  // The plan of the job as it is now, and the step it is at. Takes the
  // shared memory dp-ps offers (a fresh slot every time), as data_plane
  // says.
  absl::StatusOr<JobStatus> Register(const Registration& registration);
  // Since the last Register: tensors go through shared memory. Else why
  // not ("" when gRPC was asked for).
  bool shared_memory() const { return slot_ != nullptr; }
  const std::string& why_not_shared_memory() const { return why_not_shm_; }
  // This rank's gradient slot (empty without shared memory): the trainer
  // writes the encoded gradient here and pushes with in_shared_memory.
  absl::Span<char> GradientSlot() const;
  absl::Status Pull(int rank, Weights* weights);
  // Push, Barrier and Pull; or PushPull: push, wait at the barrier, receive
  // the new weights. Each returns the bytes it sent in *sent_bytes.
  absl::Status Push(const Gradient& gradient, int64_t* sent_bytes);
  absl::Status Barrier(int rank, int64_t step);
  absl::Status PushPull(const Gradient& gradient, Weights* weights,
                        int64_t* sent_bytes);
  absl::Status ReportEval(int rank, const EvalReport& report);

  const std::string& address() const { return options_.address; }

 private:
  // Runs `call(context)` with a fresh context and deadline until it returns
  // anything but UNAVAILABLE or retry_for has passed.
  template <typename Call>
  absl::Status WithRetry(const char* what, absl::Duration timeout, Call call);

  // A call whose messages are raw bytes (Pull, Push, PushPull), so that
  // tensors skip protobuf's copies: the blocking call generated stubs make,
  // with the ByteBuffer codec instead of the protobuf one.
  enum class Raw { kPull, kPush, kPushPull };
  absl::Status RawCall(Raw method, absl::Duration timeout,
                       const grpc::ByteBuffer& request,
                       grpc::ByteBuffer* response);
  // A Push or PushPull request sending gradient.wire without a copy.
  grpc::ByteBuffer PushRequest(const Gradient& gradient) const;
  // Parses a PullResponse into *weights.
  absl::Status ReadWeights(const grpc::ByteBuffer& response, Weights* weights);

  // The generated stub and the raw methods (ps_client.cc).
  struct Rpc;

  // Maps the regions dp-ps offered in `response` (RegisterResponse).
  absl::Status TakeSharedMemory(const std::string& socket,
                                const std::string& ticket,
                                const JobConfig& config, int64_t num_params);

  PsClientOptions options_;
  std::unique_ptr<Rpc> rpc_;
  int64_t num_params_ = 0;
  std::unique_ptr<SharedRegion> weights_;  // read-only
  std::unique_ptr<SharedRegion> slot_;
  std::string why_not_shm_;
  std::string scratch_;  // received weights that need decoding
};

}  // namespace dp

#endif  // DP_WORKER_PS_CLIENT_H_
