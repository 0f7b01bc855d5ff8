// The job's data set, as its fingerprint: unknown until the first worker
// registers with it (or a checkpoint names it), then the one every worker
// must have. Its size sets the schedule's sample count and so the job's
// length. A plain class: StepCoordinator calls it under its mutex.
#ifndef DP_SERVER_JOB_DATA_H_
#define DP_SERVER_JOB_DATA_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "common/data_order.h"
#include "common/dataset.h"

namespace dp {

class JobData {
 public:
  bool known() const { return known_; }
  // Requires known().
  const DataFingerprint& fingerprint() const { return data_; }
  std::optional<DataFingerprint> Get() const;

  // OK when `data` is the job's, or the job has none yet; otherwise a
  // FAILED_PRECONDITION naming both.
  absl::Status CheckSame(int rank, const DataFingerprint& data) const;

  // Makes `data` the job's and sets schedule->num_samples from it. When
  // the schedule cannot run on it, the error says why and nothing changes.
  absl::Status Adopt(const DataFingerprint& data, Schedule* schedule);

  // The job's steps under `schedule`: 0 while no data is known.
  int64_t TotalSteps(const Schedule& schedule) const;
  // Whether a job at `step` is over: its data is known and every step done.
  bool Over(int64_t step, const Schedule& schedule) const {
    return known_ && step >= TotalSteps(schedule);
  }

 private:
  bool known_ = false;
  DataFingerprint data_;
};

}  // namespace dp

#endif  // DP_SERVER_JOB_DATA_H_
