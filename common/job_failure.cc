// The job-failed status.
#include "common/job_failure.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace dp {
namespace {
constexpr absl::string_view kJobFailed = "the job failed: ";
}  // namespace

absl::Status JobFailedError(absl::string_view reason) {
  return absl::FailedPreconditionError(absl::StrCat(kJobFailed, reason));
}

bool IsJobFailed(const absl::Status& status) {
  return status.code() == absl::StatusCode::kFailedPrecondition &&
         absl::StartsWith(status.message(), kJobFailed);
}

}  // namespace dp
