// dp-ps's shared memory for the workers on its host (common/shared_memory.h):
// the weights, published once per version where every worker reads them,
// one gradient slot per registration of a rank, that only the process that
// registered can write, and with it the page of its step channel
// (common/step_channel.h), through which the worker's every step is posted
// without a call. gRPC stays for the rest: registration, attendance,
// pulls, evaluation reports, and every step of a worker without the page.
// A push through either says "in shared memory" instead of carrying the
// tensor; the checks, the tree sum and the status codes are the same.
#ifndef DP_SERVER_SHARED_PLANE_H_
#define DP_SERVER_SHARED_PLANE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/shared_memory.h"
#include "common/tensor_codec.h"
#include "server/adam.h"
#include "server/step_channels.h"

namespace dp {

class SharedPlane {
 public:
  static absl::StatusOr<std::unique_ptr<SharedPlane>> Start(
      int world_size, int64_t num_params, Encoding grad_encoding,
      Encoding weight_encoding);

  struct Offer {
    std::string socket;  // abstract Unix socket name
    std::string ticket;  // one-time
    uint64_t slot_id;    // named by every push through this slot
  };
  // A fresh gradient slot for `rank` and the ticket that hands it, with a
  // read-only descriptor of the weights, to the worker. The rank's old slot
  // and any ticket of it not yet redeemed are dropped: a previous process of
  // that rank no longer writes where dp-ps reads.
  absl::StatusOr<Offer> OfferTo(int rank);
  // `rank`'s slot, kept alive while the caller reads it. FAILED_PRECONDITION
  // when `slot_id` is not the slot of the rank's latest registration (it
  // never took the offer, or a newer process of the rank registered since).
  absl::StatusOr<std::shared_ptr<const SharedRegion>> Slot(
      int rank, uint64_t slot_id) const;
  // From now on every offer hands the worker a step channel's page too
  // (common/step_channel.h), whose requests `handler` serves. Called once,
  // before the first offer.
  void ServeSteps(StepChannels::Handler handler, ChannelSpin spin);
  // StepChannels::AwaitAnswered; true without step channels.
  bool AwaitStepsAnswered(absl::Duration timeout) const;
  // Serves no step channel any more: before what the handler calls goes.
  void StopSteps();
  // Writes the weights of version `step` (every value, encoded in the
  // job's weight encoding as they are written) unless that version is
  // there already.
  void Publish(int64_t step, absl::Span<const float> params);
  // Version `step` written as it is made: make(copy) must fill copy.out
  // with every value, encoded as copy.encoding - the update that makes the
  // version, in its own pass (server/adam.h). A null copy.out while no
  // worker holds a slot here: nobody would read the weights.
  void PublishAsMade(int64_t step, absl::FunctionRef<void(EncodedCopy)> make);
  // The versions Publish wrote in a pass of their own (tests).
  int64_t separate_publishes() const;

 private:
  struct GradientSlot {
    uint64_t id = 0;
    std::shared_ptr<const SharedRegion> region;
  };
  SharedPlane(std::unique_ptr<SharedMemoryOffer> offer,
              std::unique_ptr<SharedRegion> weights, int world_size,
              int64_t num_values, size_t slot_bytes, Encoding weight_encoding);

  const std::unique_ptr<SharedMemoryOffer> offer_;
  const size_t slot_bytes_;
  const Encoding weight_encoding_;
  const int64_t num_values_;
  mutable absl::Mutex mu_;
  std::unique_ptr<SharedRegion> weights_ ABSL_GUARDED_BY(mu_);
  int64_t published_step_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t separate_publishes_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<GradientSlot> slots_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<StepChannels> channels_;  // set before the first offer
};

}  // namespace dp

#endif  // DP_SERVER_SHARED_PLANE_H_
