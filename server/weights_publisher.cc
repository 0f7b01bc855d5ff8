// The coordinator's published weights.
#include "server/weights_publisher.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dp {

WeightsPublisher::WeightsPublisher(int64_t n, Encoding encoding,
                                   bool keep_previous)
    : n_(n),
      encoding_(encoding),
      previous_(keep_previous ? n : 0),
      snapshots_(n * BytesPerValue(encoding)) {}

WeightsPublisher::Snapshot WeightsPublisher::Current(
    const std::vector<float>& params) {
  if (published_ == nullptr) {
    // A buffer that a response in flight still sends from is never
    // overwritten: Free() skips it (its lease is held).
    published_ = &snapshots_.Free();
    Encode(encoding_, params.data(), n_, published_->data());
    ++snapshots_made_;
  }
  return Snapshot{published_->Lend(), published_->view()};
}

WeightsPublisher::Snapshot WeightsPublisher::Previous() const {
  auto bytes =
      std::make_shared<std::string>(n_ * BytesPerValue(encoding_), '\0');
  Encode(encoding_, previous_.data(), n_, bytes->data());
  const absl::string_view all(*bytes);
  return Snapshot{std::move(bytes), all};
}

void WeightsPublisher::BeforeUpdate(const std::vector<float>& params) {
  if (!previous_.empty()) {
    std::memcpy(previous_.data(), params.data(), n_ * sizeof(float));
    holds_previous_ = true;
  }
  published_ = nullptr;
}

void WeightsPublisher::Reset() {
  holds_previous_ = false;
  published_ = nullptr;
}

absl::StatusOr<WeightsPublisher::Snapshot> WeightsPublisher::Serve(
    int rank, std::optional<int64_t> version, int64_t step,
    const std::vector<float>& params) {
  if (!version.has_value() || *version == step) return Current(params);
  if (*version == step - 1 && holds_previous_) return Previous();
  const std::string what = absl::StrFormat(
      "rank %d asks for the weights of version %d; this dp-ps is at version "
      "%d and holds %s",
      rank, *version, step,
      holds_previous_ ? "the one before too" : "no other");
  if (*version < 0) return absl::FailedPreconditionError(what);
  // Later: this shard lacks a step another applied (it restarted from an
  // older checkpoint); the caller's next join rolls the shards back.
  return absl::AbortedError(
      *version > step ? absl::StrCat(what, ": this shard is behind") : what);
}

}  // namespace dp
