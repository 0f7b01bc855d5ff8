// Stateless checks of every dp.v1 request before it reaches the coordinator.
#include "server/request_validator.h"

#include <cmath>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
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
bool IsPrintableAscii(absl::string_view s) {
  for (char c : s) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

}  // namespace

RequestValidator::RequestValidator(int world_size, const ModelLayout& layout,
                                   ParamRange owned)
    : world_size_(world_size),
      owned_(owned.length > 0 ? owned : ParamRange{0, layout.num_params()}),
      model_fingerprint_(layout.Fingerprint()) {}

absl::Status CheckRankInJob(const char* rpc, int rank, int world_size) {
  if (rank < 0 || rank >= world_size) {
    return Invalid(
        "%s: rank %d is out of range: this job has %d workers (ranks 0..%d)",
        rpc, rank, world_size, world_size - 1);
  }
  return absl::OkStatus();
}

absl::Status CheckModelFingerprint(int rank, uint64_t model_fingerprint,
                                   uint64_t expected) {
  if (model_fingerprint != expected) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "rank %d runs a different model (fingerprint %016x, dp-ps has %016x)",
        rank, model_fingerprint, expected));
  }
  return absl::OkStatus();
}

absl::Status CheckPullRange(int rank, int64_t offset, int64_t length,
                            ParamRange owned) {
  // Written so that nothing can overflow: offset in [begin, end] first.
  if (offset < owned.offset || offset > owned.end() || length < 0 ||
      length > owned.end() - offset) {
    return Invalid(
        "Pull from rank %d: range (offset %d, length %d) is outside the "
        "range this dp-ps owns [%d, %d)",
        rank, offset, length, owned.offset, owned.end());
  }
  return absl::OkStatus();
}

absl::Status CheckEvalReport(int rank, const EvalReport& r) {
  if (r.step < 0 || r.step > kMaxStep) {
    return Invalid("ReportEval from rank %d: step %d is out of range [0, %d]",
                   rank, r.step, kMaxStep);
  }
  if (!(r.accuracy >= 0.0 && r.accuracy <= 1.0) || !std::isfinite(r.loss) ||
      std::fabs(r.loss) > kMaxAbsLoss || r.num_samples < 0 ||
      r.num_samples > kMaxSamples || r.epoch < 0 || r.epoch > kMaxEpoch) {
    return Invalid(
        "evaluation report from rank %d is invalid (accuracy %g, loss %g, %d "
        "samples, epoch %d)",
        rank, r.accuracy, r.loss, r.num_samples, r.epoch);
  }
  return absl::OkStatus();
}

absl::Status CheckRollback(const ShardSpec& shard, uint64_t generation,
                           uint64_t current, const TrainingState& state) {
  if (generation != current) {
    return absl::AbortedError(absl::StrFormat(
        "rollback refused: %s changed since it was decided (generation "
        "%016x, now %016x); re-sync",
        shard.ToString(), generation, current));
  }
  const int64_t n = shard.range.length;
  if (static_cast<int64_t>(state.params.size()) != n ||
      static_cast<int64_t>(state.m.size()) != n ||
      static_cast<int64_t>(state.v.size()) != n) {
    return Invalid("rollback state has %d values; %s has %d",
                   state.params.size(), shard.ToString(), n);
  }
  return absl::OkStatus();
}

absl::Status CheckLoss(int rank, int64_t step, float loss) {
  if (!std::isfinite(loss) || std::fabs(loss) > kMaxAbsLoss) {
    return Invalid(
        "loss from rank %d for step %d is not finite or out of range (%g)",
        rank, step, loss);
  }
  return absl::OkStatus();
}

absl::Status CheckGradientEncoding(int rank, Encoding encoding,
                                   Encoding expected) {
  if (encoding == expected) return absl::OkStatus();
  return Invalid("gradient from rank %d is encoded as %s; this job uses %s",
                 rank, EncodingName(encoding), EncodingName(expected));
}

absl::Status CheckPushedBlock(int rank, int micro_batches, const Block& block) {
  if (IsNode(micro_batches, block)) return absl::OkStatus();
  return Invalid(
      "rank %d pushed micro-batches %s, which is not a block of the step's "
      "%d micro-batches",
      rank, block.ToString(), micro_batches);
}

absl::Status BadGradientValue(int rank, int64_t step, int64_t index,
                              float value) {
  return Invalid(
      "gradient from rank %d for step %d has a non-finite or out-of-range "
      "value (%g, limit %g) at index %d",
      rank, step, value, kMaxAbsGradient, index);
}

absl::Status RequestValidator::CheckStep(const char* rpc, int rank,
                                         int64_t step) const {
  if (step < 0 || step > kMaxStep) {
    return Invalid("%s from rank %d: step %d is out of range [0, %d]", rpc,
                   rank, step, kMaxStep);
  }
  return absl::OkStatus();
}

absl::Status CheckGradientShape(int rank, Encoding encoding, int64_t offset,
                                size_t bytes, ParamRange owned) {
  const int64_t expected =
      owned.length * static_cast<int64_t>(BytesPerValue(encoding));
  if (offset != owned.offset || static_cast<int64_t>(bytes) != expected) {
    return Invalid(
        "gradient from rank %d covers %d bytes at offset %d; this dp-ps owns "
        "[%d, %d) and expects %d bytes (%d %s values) at offset %d",
        rank, bytes, offset, owned.offset, owned.end(), expected, owned.length,
        EncodingName(encoding), owned.offset);
  }
  return absl::OkStatus();
}

absl::Status RequestValidator::CheckRegister(
    int rank, uint64_t model_fingerprint, const DataFingerprint* data,
    absl::string_view worker_id) const {
  RETURN_IF_ERROR(CheckRankInJob("Register", rank, world_size_));
  RETURN_IF_ERROR(
      CheckModelFingerprint(rank, model_fingerprint, model_fingerprint_));
  if (data == nullptr) {
    return Invalid("Register from rank %d carries no data fingerprint", rank);
  }
  if (data->num_samples < 1 || data->num_samples > kMaxSamples) {
    return Invalid(
        "Register from rank %d: data set size %d is out of range [1, %d]", rank,
        data->num_samples, kMaxSamples);
  }
  if (worker_id.size() > kMaxWorkerIdBytes || !IsPrintableAscii(worker_id)) {
    return Invalid(
        "Register from rank %d: worker_id must be at most %d printable ASCII "
        "characters (got %d bytes)",
        rank, kMaxWorkerIdBytes, worker_id.size());
  }
  return absl::OkStatus();
}

absl::Status RequestValidator::CheckPull(int rank, int64_t offset,
                                         int64_t length) const {
  RETURN_IF_ERROR(CheckRankInJob("Pull", rank, world_size_));
  return CheckPullRange(rank, offset, length, owned_);
}

absl::Status RequestValidator::CheckPush(int rank, int64_t step, int64_t offset,
                                         int encoding, size_t gradient_bytes,
                                         float loss,
                                         int64_t num_samples) const {
  RETURN_IF_ERROR(CheckRankInJob("Push", rank, world_size_));
  RETURN_IF_ERROR(CheckStep("Push", rank, step));
  if (encoding != static_cast<int>(Encoding::kF32) &&
      encoding != static_cast<int>(Encoding::kBf16)) {
    return Invalid("gradient from rank %d has an unknown encoding %d", rank,
                   encoding);
  }
  RETURN_IF_ERROR(CheckGradientShape(rank, static_cast<Encoding>(encoding),
                                     offset, gradient_bytes, owned_));
  RETURN_IF_ERROR(CheckLoss(rank, step, loss));
  if (num_samples < 0 || num_samples > kMaxSamples) {
    return Invalid("Push from rank %d: num_samples %d is out of range", rank,
                   num_samples);
  }
  return absl::OkStatus();
}

absl::Status RequestValidator::CheckBarrier(int rank, int64_t step) const {
  RETURN_IF_ERROR(CheckRankInJob("Barrier", rank, world_size_));
  return CheckStep("Barrier", rank, step);
}

absl::Status RequestValidator::CheckEval(int rank, const EvalReport& r) const {
  RETURN_IF_ERROR(CheckRankInJob("ReportEval", rank, world_size_));
  return CheckEvalReport(rank, r);
}

absl::Status RequestValidator::CheckAttend(int rank, uint64_t session) const {
  RETURN_IF_ERROR(CheckRankInJob("Attend", rank, world_size_));
  if (session == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Attend: rank %d names no session (RegisterResponse.session)", rank));
  }
  return absl::OkStatus();
}

}  // namespace dp
