// The status of a job that dp-ps ended, as every process tells it: plain
// absl::Status, so that the coordinator needs no gRPC header for it.
#ifndef DP_COMMON_JOB_FAILURE_H_
#define DP_COMMON_JOB_FAILURE_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace dp {

// dp-ps ended the job (e.g. --on_worker_loss=fail): FAILED_PRECONDITION,
// "the job failed: <reason>". Every later request gets it too. Of the codes
// docs/protocol.md documents, FAILED_PRECONDITION is the one that says "the
// server is not in a state to do this, and asking again will not change that":
// ABORTED would make workers re-sync, UNAVAILABLE retry, and CANCELLED is
// what a client's own cancellation looks like (and is not counted as a
// rejection). The message prefix tells it from the other
// FAILED_PRECONDITION, "not registered", after which a worker registers
// again.
absl::Status JobFailedError(absl::string_view reason);
// True for a JobFailedError, also after it crossed the wire.
bool IsJobFailed(const absl::Status& status);

}  // namespace dp

#endif  // DP_COMMON_JOB_FAILURE_H_
