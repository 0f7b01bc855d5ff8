// Shared weights and gradient slots of dp-ps (see shared_plane.h).
#include "server/shared_plane.h"

#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace dp {
namespace {

// Unpredictable, so that no process - a previous dp-ps's worker included -
// names a slot it was not given by chance or by counting.
uint64_t NewSlotId() {
  uint64_t id = 0;
  while (id == 0) {
    if (getrandom(&id, sizeof(id), 0) != sizeof(id)) id = 0;
  }
  return id;
}

}  // namespace

SharedPlane::SharedPlane(std::unique_ptr<SharedMemoryOffer> offer,
                         std::unique_ptr<SharedRegion> weights, int world_size,
                         int64_t num_values, size_t slot_bytes,
                         Encoding weight_encoding)
    : offer_(std::move(offer)),
      slot_bytes_(slot_bytes),
      weight_encoding_(weight_encoding),
      num_values_(num_values),
      weights_(std::move(weights)),
      slots_(world_size) {}

absl::StatusOr<std::unique_ptr<SharedPlane>> SharedPlane::Start(
    int world_size, int64_t num_params, Encoding grad_encoding,
    Encoding weight_encoding) {
  ASSIGN_OR_RETURN(std::unique_ptr<SharedMemoryOffer> offer,
                   SharedMemoryOffer::Start());
  ASSIGN_OR_RETURN(
      std::unique_ptr<SharedRegion> weights,
      SharedRegion::Create("dp-ps weights",
                           WeightsRegionBytes(num_params, weight_encoding),
                           SharedRegion::Peers::kReadOnly));
  return std::unique_ptr<SharedPlane>(new SharedPlane(
      std::move(offer), std::move(weights), world_size, num_params,
      static_cast<size_t>(num_params) * BytesPerValue(grad_encoding),
      weight_encoding));
}

absl::StatusOr<SharedPlane::Offer> SharedPlane::OfferTo(int rank) {
  ASSIGN_OR_RETURN(std::unique_ptr<SharedRegion> region,
                   SharedRegion::Create("dp-ps gradient slot", slot_bytes_));
  std::vector<int> fds;
  // Closes what was made for the ticket when the offer fails.
  auto fail = [&fds](absl::Status s) {
    for (int fd : fds) close(fd);
    return s;
  };
  absl::StatusOr<int> weights_fd;
  {
    absl::MutexLock lock(&mu_);
    weights_fd = weights_->ReadOnlyDescriptor();
  }
  if (!weights_fd.ok()) return weights_fd.status();
  fds.push_back(*weights_fd);
  fds.push_back(dup(region->fd()));
  if (fds.back() < 0) {
    fds.pop_back();
    return fail(absl::InternalError("dup of a gradient slot's descriptor"));
  }
  const uint64_t id = NewSlotId();
  if (channels_ != nullptr) {
    // Opened before the slot is the rank's: a push through the new slot
    // cannot come before its page is served.
    absl::StatusOr<int> page = channels_->Open(rank, id);
    if (!page.ok()) return fail(page.status());
    fds.push_back(*page);
  }
  absl::MutexLock lock(&mu_);
  slots_[rank] = GradientSlot{id, std::move(region)};
  return Offer{offer_->socket_name(), offer_->IssueTicket(rank, fds), id};
}

void SharedPlane::ServeSteps(StepChannels::Handler handler, ChannelSpin spin) {
  channels_ = std::make_unique<StepChannels>(std::move(handler), spin);
}

bool SharedPlane::AwaitStepsAnswered(absl::Duration timeout) const {
  return channels_ == nullptr || channels_->AwaitAnswered(timeout);
}

void SharedPlane::StopSteps() {
  if (channels_ != nullptr) channels_->StopAll();
}

absl::StatusOr<std::shared_ptr<const SharedRegion>> SharedPlane::Slot(
    int rank, uint64_t slot_id) const {
  absl::MutexLock lock(&mu_);
  if (rank < 0 || rank >= static_cast<int>(slots_.size()) ||
      slots_[rank].region == nullptr) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "rank %d sent its gradient through shared memory it was never given "
        "(register again)",
        rank));
  }
  if (slots_[rank].id != slot_id) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "rank %d pushed through a gradient slot it no longer holds (another "
        "process of rank %d registered since): register again",
        rank, rank));
  }
  return slots_[rank].region;
}

void SharedPlane::Publish(int64_t step, absl::Span<const float> params) {
  absl::MutexLock lock(&mu_);
  if (step == published_step_) return;
  PublishWeights(weights_.get(), step, weight_encoding_, params);
  published_step_ = step;
  ++separate_publishes_;
}

void SharedPlane::PublishAsMade(int64_t step,
                                absl::FunctionRef<void(EncodedCopy)> make) {
  absl::MutexLock lock(&mu_);
  const bool read_here =
      std::any_of(slots_.begin(), slots_.end(),
                  [](const GradientSlot& s) { return s.region != nullptr; });
  if (!read_here) {
    // The buffer of `step` does not hold it: the next Publish writes it.
    published_step_ = -1;
    return make(EncodedCopy{});
  }
  make(EncodedCopy{
      BeginWeights(weights_.get(), step, weight_encoding_, num_values_),
      weight_encoding_});
  EndWeights(weights_.get(), step);
  published_step_ = step;
}

int64_t SharedPlane::separate_publishes() const {
  absl::MutexLock lock(&mu_);
  return separate_publishes_;
}

}  // namespace dp
