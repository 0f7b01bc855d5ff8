// The edge of dp-ps: every request passes RequestValidator before it may
// touch state. It checks everything that needs no state - ranks, steps,
// ranges, sizes, finite and bounded values, fingerprints, the length and
// characters of every string - so that the StepCoordinator is left with the
// decisions that depend on the step (and keeps its own checks of the
// invariants it relies on). Requests of dp.v1 have no repeated fields; the
// size of a whole message is bounded by gRPC (RESOURCE_EXHAUSTED).
//
// Codes follow README.md: INVALID_ARGUMENT for malformed values,
// FAILED_PRECONDITION for a different model.
#ifndef DP_SERVER_REQUEST_VALIDATOR_H_
#define DP_SERVER_REQUEST_VALIDATOR_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/model_layout.h"
#include "proto/dp.pb.h"

namespace dp {

// Bounds no sane request comes near; they keep every later computation in
// range (steps in int64 sums, sample counts in the int32 data order).
inline constexpr int64_t kMaxStep = int64_t{1} << 48;
inline constexpr int64_t kMaxSamples = (int64_t{1} << 31) - 1;
inline constexpr int kMaxEpoch = 1 << 24;
inline constexpr double kMaxAbsLoss = 1e15;
inline constexpr size_t kMaxWorkerIdBytes = 256;

class RequestValidator {
 public:
  RequestValidator(int world_size, const ModelLayout& layout);

  // OK when the request may be handed to the StepCoordinator.
  [[nodiscard]] absl::Status Check(const dp::v1::RegisterRequest& r) const;
  [[nodiscard]] absl::Status Check(const dp::v1::PullRequest& r) const;
  [[nodiscard]] absl::Status Check(const dp::v1::PushRequest& r) const {
    return Check(r, r.gradient());
  }
  // A push whose gradient travels outside the message (tensor_message.h);
  // r.gradient() is ignored.
  [[nodiscard]] absl::Status Check(const dp::v1::PushRequest& r,
                                   absl::string_view gradient) const;
  [[nodiscard]] absl::Status Check(const dp::v1::BarrierRequest& r) const;
  [[nodiscard]] absl::Status Check(const dp::v1::ReportEvalRequest& r) const;
  [[nodiscard]] absl::Status Check(const dp::v1::GetStatusRequest& r) const;

 private:
  absl::Status CheckRank(const char* rpc, int rank) const;
  absl::Status CheckStep(const char* rpc, int rank, int64_t step) const;

  const int world_size_;
  const int64_t num_params_;
  const uint64_t model_fingerprint_;
};

}  // namespace dp

#endif  // DP_SERVER_REQUEST_VALIDATOR_H_
