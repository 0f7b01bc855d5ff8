// The edge of dp-ps: every request passes RequestValidator before it may
// touch state. It checks everything that needs no state - ranks, steps,
// ranges, sizes, finite and bounded values, fingerprints, the length and
// characters of every string - so that a bad request is refused before
// anything is locked or read. The StepCoordinator makes the decisions that
// depend on the step, and repeats the six checks below that keep it safe on
// its own (a rank, a range or a shape out of bounds would index past a
// buffer; a fingerprint, a loss or a report out of range would be stored),
// calling the same functions, because it is called without this validator
// too (its tests, the fuzzer). The values of a gradient are checked only
// there, as they are decoded, so that each gradient is read once. It takes the
// requests' fields (PsService and the tests unpack dp.v1 messages; see
// ps_service.h's CheckRequest). Requests of dp.v1 have no repeated fields; the
// size of a whole message is bounded by gRPC (RESOURCE_EXHAUSTED).
//
// Codes follow docs/protocol.md: INVALID_ARGUMENT for malformed values,
// FAILED_PRECONDITION for a different model.
#ifndef DP_SERVER_REQUEST_VALIDATOR_H_
#define DP_SERVER_REQUEST_VALIDATOR_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/dataset.h"
#include "common/job_config.h"
#include "common/micro_batch_tree.h"
#include "common/model_layout.h"
#include "common/shard_plan.h"

namespace dp {

// Bounds no sane request comes near; they keep every later computation in
// range (steps in int64 sums, sample counts in the int32 data order).
inline constexpr int64_t kMaxStep = int64_t{1} << 48;
inline constexpr int64_t kMaxSamples = (int64_t{1} << 31) - 1;
inline constexpr int kMaxEpoch = 1 << 24;
inline constexpr double kMaxAbsLoss = 1e15;
inline constexpr size_t kMaxWorkerIdBytes = 256;

// The checks that the validator and the coordinator (which must never index
// past a buffer, whoever calls it) both make, in one place each.
// INVALID_ARGUMENT unless 0 <= rank < world_size; `rpc` names the call.
absl::Status CheckRankInJob(const char* rpc, int rank, int world_size);
// FAILED_PRECONDITION unless the worker's model is dp-ps's.
absl::Status CheckModelFingerprint(int rank, uint64_t model_fingerprint,
                                   uint64_t expected);
// INVALID_ARGUMENT unless [offset, offset + length) lies in `owned`
// (length 0: to its end).
absl::Status CheckPullRange(int rank, int64_t offset, int64_t length,
                            ParamRange owned);
// INVALID_ARGUMENT unless a gradient of `bytes` bytes at `offset` in
// `encoding` covers exactly the range `owned` of the vector.
absl::Status CheckGradientShape(int rank, Encoding encoding, int64_t offset,
                                size_t bytes, ParamRange owned);
// INVALID_ARGUMENT unless a gradient comes in the job's encoding.
absl::Status CheckGradientEncoding(int rank, Encoding encoding,
                                   Encoding expected);
// INVALID_ARGUMENT unless `block` is a node of the step's micro-batch tree.
absl::Status CheckPushedBlock(int rank, int micro_batches, const Block& block);
// The INVALID_ARGUMENT of a gradient whose value at `index` of the vector
// is not finite or beyond kMaxAbsGradient (found as it is read).
absl::Status BadGradientValue(int rank, int64_t step, int64_t index,
                              float value);
// A rollback of `shard` to `state`, decided at `generation`: ABORTED when
// the shard changed since (now at `current`), INVALID_ARGUMENT unless the
// state has the shard's size.
absl::Status CheckRollback(const ShardSpec& shard, uint64_t generation,
                           uint64_t current, const TrainingState& state);
// INVALID_ARGUMENT unless the loss is finite and within kMaxAbsLoss.
absl::Status CheckLoss(int rank, int64_t step, float loss);
// INVALID_ARGUMENT unless every field of the report is in range.
absl::Status CheckEvalReport(int rank, const EvalReport& report);

class RequestValidator {
 public:
  // `owned`: the range of the vector this dp-ps holds (a shard's); empty
  // means all of it.
  RequestValidator(int world_size, const ModelLayout& layout,
                   ParamRange owned = {});

  // Each: OK when a request with these fields may be handed to the
  // StepCoordinator. `data` is null when the request carries none.
  [[nodiscard]] absl::Status CheckRegister(int rank, uint64_t model_fingerprint,
                                           const DataFingerprint* data,
                                           absl::string_view worker_id) const;
  [[nodiscard]] absl::Status CheckPull(int rank, int64_t offset,
                                       int64_t length) const;
  // `encoding` as it came on the wire; the gradient's values are the
  // coordinator's to check.
  [[nodiscard]] absl::Status CheckPush(int rank, int64_t step, int64_t offset,
                                       int encoding, size_t gradient_bytes,
                                       float loss, int64_t num_samples) const;
  [[nodiscard]] absl::Status CheckBarrier(int rank, int64_t step) const;
  [[nodiscard]] absl::Status CheckEval(int rank,
                                       const EvalReport& report) const;
  // A session is never 0 (RegisterResponse.session).
  [[nodiscard]] absl::Status CheckAttend(int rank, uint64_t session) const;

 private:
  absl::Status CheckStep(const char* rpc, int rank, int64_t step) const;

  const int world_size_;
  const ParamRange owned_;
  const uint64_t model_fingerprint_;
};

}  // namespace dp

#endif  // DP_SERVER_REQUEST_VALIDATOR_H_
