// dp-worker's exit code for the outcome of its run (the codes are in
// common/flags.h). A Kubernetes Job's podFailurePolicy keys on them
// (deploy/k8s): a configuration error fails the Job, dp-ps unreachable is
// retried without counting, a node that cannot run the backend is retried,
// counted against the rank's own backoff limit. Two outcomes share their
// status code with others, so the code that finds them marks them here.
#ifndef DP_WORKER_EXIT_CODE_H_
#define DP_WORKER_EXIT_CODE_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace dp {

// UNAVAILABLE: no dp-ps answered for --retry_for_s (exit 4).
absl::Status PsUnreachableError(absl::string_view message);
bool IsPsUnreachable(const absl::Status& status);

// `cause` (its code and message) marked as this node's fault: no CUDA
// driver, one too old, no GPU visible, no kernel image for it (exit 5).
absl::Status CannotRunHere(absl::Status cause);
bool IsCannotRunHere(const absl::Status& status);

// 0 for OK; 3 once stopped by a signal; 1 when dp-ps failed the job; 4, 5
// for the marked outcomes above; 2 for a configuration error
// (INVALID_ARGUMENT, FAILED_PRECONDITION, UNAUTHENTICATED, NOT_FOUND,
// DATA_LOSS: the same on every retry); 1 for anything else.
int WorkerExitCode(const absl::Status& status, bool stopped);

}  // namespace dp

#endif  // DP_WORKER_EXIT_CODE_H_
