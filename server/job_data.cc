#include "server/job_data.h"

#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace dp {

std::optional<DataFingerprint> JobData::Get() const {
  if (!known_) return std::nullopt;
  return data_;
}

absl::Status JobData::CheckSame(int rank, const DataFingerprint& data) const {
  if (!known_ || data == data_) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "rank %d has different data (%d samples, hash %016x) from the job's "
      "(%d samples, hash %016x): check --data_dir",
      rank, data.num_samples, data.hash, data_.num_samples, data_.hash));
}

absl::Status JobData::Adopt(const DataFingerprint& data, Schedule* schedule) {
  Schedule adopted = *schedule;
  adopted.num_samples = data.num_samples;
  RETURN_IF_ERROR(ValidateSchedule(adopted));
  *schedule = adopted;
  data_ = data;
  known_ = true;
  return absl::OkStatus();
}

int64_t JobData::TotalSteps(const Schedule& schedule) const {
  return known_ ? schedule.total_steps() : 0;
}

}  // namespace dp
