// Stateless checks of every dp.v1 request before it reaches the coordinator.
#include "server/request_validator.h"

#include "common/tensor_codec.h"

#include <cmath>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "server/adam.h"

namespace dp {
namespace {

absl::Status Invalid(const absl::FormatSpec<>& format) {
  return absl::InvalidArgumentError(absl::StrFormat(format));
}

template <typename... Args>
absl::Status Invalid(const absl::FormatSpec<Args...>& format,
                     const Args&... args) {
  return absl::InvalidArgumentError(absl::StrFormat(format, args...));
}

// Printable ASCII only: a worker id ends up in logs, where control
// characters could forge lines.
bool IsPrintableAscii(const std::string& s) {
  for (char c : s) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

}  // namespace

RequestValidator::RequestValidator(int world_size, const ModelLayout& layout)
    : world_size_(world_size),
      num_params_(layout.num_params()),
      model_fingerprint_(layout.Fingerprint()) {}

absl::Status RequestValidator::CheckRank(const char* rpc, int rank) const {
  if (rank < 0 || rank >= world_size_) {
    return Invalid(
        "%s: rank %d is out of range: this job has %d workers (ranks 0..%d)",
        rpc, rank, world_size_, world_size_ - 1);
  }
  return absl::OkStatus();
}

absl::Status RequestValidator::CheckStep(const char* rpc, int rank,
                                         int64_t step) const {
  if (step < 0 || step > kMaxStep) {
    return Invalid("%s from rank %d: step %d is out of range [0, %d]", rpc,
                   rank, step, kMaxStep);
  }
  return absl::OkStatus();
}

absl::Status RequestValidator::Check(const dp::v1::RegisterRequest& r) const {
  RETURN_IF_ERROR(CheckRank("Register", r.rank()));
  if (r.model_fingerprint() != model_fingerprint_) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "rank %d runs a different model (fingerprint %016x, dp-ps has %016x)",
        r.rank(), r.model_fingerprint(), model_fingerprint_));
  }
  if (!r.has_data()) {
    return Invalid("Register from rank %d carries no data fingerprint",
                   r.rank());
  }
  if (r.data().num_samples() < 1 || r.data().num_samples() > kMaxSamples) {
    return Invalid(
        "Register from rank %d: data set size %d is out of range [1, %d]",
        r.rank(), r.data().num_samples(), kMaxSamples);
  }
  if (r.worker_id().size() > kMaxWorkerIdBytes ||
      !IsPrintableAscii(r.worker_id())) {
    return Invalid(
        "Register from rank %d: worker_id must be at most %d printable ASCII "
        "characters (got %d bytes)",
        r.rank(), kMaxWorkerIdBytes, r.worker_id().size());
  }
  return absl::OkStatus();
}

absl::Status RequestValidator::Check(const dp::v1::PullRequest& r) const {
  RETURN_IF_ERROR(CheckRank("Pull", r.rank()));
  // Written so that nothing can overflow: offset in [0, n] first.
  if (r.offset() < 0 || r.offset() > num_params_ || r.length() < 0 ||
      r.length() > num_params_ - r.offset()) {
    return Invalid(
        "Pull from rank %d: range (offset %d, length %d) is outside the "
        "parameter vector [0, %d)",
        r.rank(), r.offset(), r.length(), num_params_);
  }
  return absl::OkStatus();
}

absl::Status RequestValidator::Check(const dp::v1::PushRequest& r,
                                     absl::string_view gradient) const {
  RETURN_IF_ERROR(CheckRank("Push", r.rank()));
  RETURN_IF_ERROR(CheckStep("Push", r.rank(), r.step()));
  if (r.encoding() != dp::v1::ENCODING_F32 &&
      r.encoding() != dp::v1::ENCODING_BF16) {
    return Invalid("gradient from rank %d has an unknown encoding %d",
                   r.rank(), static_cast<int>(r.encoding()));
  }
  const Encoding encoding = static_cast<Encoding>(r.encoding());
  const int64_t bytes =
      num_params_ * static_cast<int64_t>(BytesPerValue(encoding));
  if (r.offset() != 0 || static_cast<int64_t>(gradient.size()) != bytes) {
    return Invalid(
        "gradient from rank %d covers %d bytes at offset %d; this dp-ps owns "
        "[0, %d) and expects %d bytes (%d %s values)",
        r.rank(), gradient.size(), r.offset(), num_params_, bytes,
        num_params_, EncodingName(encoding));
  }
  if (int64_t bad = FirstOutOfRange(encoding, gradient.data(),
                                    num_params_, kMaxAbsGradient);
      bad >= 0) {
    float value;
    Decode(encoding, gradient.data() + bad * BytesPerValue(encoding), 1,
           &value);
    return Invalid(
        "gradient from rank %d for step %d has a non-finite or out-of-range "
        "value (%g, limit %g) at index %d",
        r.rank(), r.step(), value, kMaxAbsGradient, bad);
  }
  if (!std::isfinite(r.loss()) || std::fabs(r.loss()) > kMaxAbsLoss) {
    return Invalid(
        "loss from rank %d for step %d is not finite or out of "
        "range (%g)",
        r.rank(), r.step(), r.loss());
  }
  if (r.num_samples() < 0 || r.num_samples() > kMaxSamples) {
    return Invalid("Push from rank %d: num_samples %d is out of range",
                   r.rank(), r.num_samples());
  }
  return absl::OkStatus();
}

absl::Status RequestValidator::Check(const dp::v1::BarrierRequest& r) const {
  RETURN_IF_ERROR(CheckRank("Barrier", r.rank()));
  return CheckStep("Barrier", r.rank(), r.step());
}

absl::Status RequestValidator::Check(const dp::v1::ReportEvalRequest& r) const {
  RETURN_IF_ERROR(CheckRank("ReportEval", r.rank()));
  RETURN_IF_ERROR(CheckStep("ReportEval", r.rank(), r.step()));
  if (!(r.accuracy() >= 0.0 && r.accuracy() <= 1.0) ||
      !std::isfinite(r.loss()) || std::fabs(r.loss()) > kMaxAbsLoss ||
      r.num_samples() < 0 || r.num_samples() > kMaxSamples || r.epoch() < 0 ||
      r.epoch() > kMaxEpoch) {
    return Invalid(
        "evaluation report from rank %d is invalid (accuracy %g, loss %g, %d "
        "samples, epoch %d)",
        r.rank(), r.accuracy(), r.loss(), r.num_samples(), r.epoch());
  }
  return absl::OkStatus();
}

absl::Status RequestValidator::Check(
    const dp::v1::GetStatusRequest& /*r*/) const {
  return absl::OkStatus();
}

}  // namespace dp
