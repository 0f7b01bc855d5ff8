// The weights a coordinator hands out: the current version encoded once
// into a snapshot that responses in flight send from (never overwritten
// while one holds it), and, sharded, the version before, for a worker that
// joins while another shard still waits for its push of that step. A plain
// class: StepCoordinator calls it under its mutex.
#ifndef DP_SERVER_WEIGHTS_PUBLISHER_H_
#define DP_SERVER_WEIGHTS_PUBLISHER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/lent_buffer.h"
#include "common/tensor_codec.h"

namespace dp {

class WeightsPublisher {
 public:
  // `n` values in `encoding`; `keep_previous`: hold the version before the
  // current one (a sharded coordinator).
  WeightsPublisher(int64_t n, Encoding encoding, bool keep_previous);

  // An encoded copy of the weights and a lease that keeps it alive and
  // unwritten while held.
  struct Snapshot {
    std::shared_ptr<const void> lease;
    absl::string_view bytes;  // all n values, encoded
  };
  // The current version's snapshot, `params`: encoded at the first call
  // after an update, then the same.
  Snapshot Current(const std::vector<float>& params);
  // The version before the current one, in a buffer of its own (rare: a
  // join while the shards are a step apart). Requires holds_previous().
  Snapshot Previous() const;

  // The snapshot of the version `rank` asks for (none: the current one,
  // `step`, from `params`): the current or the one before. Any other is
  // ABORTED: older, the job moved on since the caller looked; later, this
  // shard is behind the others (it restarted from an older checkpoint).
  // The caller looks again. A negative one is FAILED_PRECONDITION.
  absl::StatusOr<Snapshot> Serve(int rank, std::optional<int64_t> version,
                                 int64_t step,
                                 const std::vector<float>& params);

  // `params` are about to be updated: kept as the version before
  // (keep_previous), and the snapshot is out of date.
  void BeforeUpdate(const std::vector<float>& params);
  // The weights were set back (a rollback): no snapshot, no version before.
  void Reset();

  bool holds_previous() const { return holds_previous_; }
  // How many times Current encoded the weights.
  int64_t snapshots_made() const { return snapshots_made_; }

 private:
  const int64_t n_;
  const Encoding encoding_;
  std::vector<float> previous_;
  bool holds_previous_ = false;
  // The current version's snapshot (null until the first Current after an
  // update), and the buffers snapshots are made in.
  LentBuffer* published_ = nullptr;
  LentBufferPool snapshots_;
  int64_t snapshots_made_ = 0;
};

}  // namespace dp

#endif  // DP_SERVER_WEIGHTS_PUBLISHER_H_
