// dp-worker's outcomes and their exit codes (see exit_code.h).
#include "worker/exit_code.h"

#include <string>
#include <utility>

#include "absl/strings/cord.h"
#include "common/flags.h"
#include "common/job_failure.h"

namespace dp {
namespace {

// A status payload, local to the process (never sent over the wire).
constexpr absl::string_view kOutcomeUrl = "type.dp-ps/worker-outcome";
constexpr absl::string_view kPsUnreachable = "ps-unreachable";
constexpr absl::string_view kCannotRunHere = "cannot-run-here";

bool HasOutcome(const absl::Status& status, absl::string_view outcome) {
  const auto payload = status.GetPayload(kOutcomeUrl);  // absl::optional
  return payload.has_value() && *payload == outcome;
}

absl::Status WithOutcome(absl::Status status, absl::string_view outcome) {
  status.SetPayload(kOutcomeUrl, absl::Cord(outcome));
  return status;
}

}  // namespace

absl::Status PsUnreachableError(absl::string_view message) {
  return WithOutcome(absl::UnavailableError(message), kPsUnreachable);
}

bool IsPsUnreachable(const absl::Status& status) {
  return HasOutcome(status, kPsUnreachable);
}

absl::Status CannotRunHere(absl::Status cause) {
  return WithOutcome(std::move(cause), kCannotRunHere);
}

bool IsCannotRunHere(const absl::Status& status) {
  return HasOutcome(status, kCannotRunHere);
}

int WorkerExitCode(const absl::Status& status, bool stopped) {
  if (status.ok()) return kExitOk;
  if (stopped) return kExitInterrupted;
  if (IsJobFailed(status)) return kExitFailure;
  if (IsPsUnreachable(status)) return kExitPsUnreachable;
  if (IsCannotRunHere(status)) return kExitCannotRunHere;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kDataLoss:
      return kExitConfigError;
    default:
      return kExitFailure;
  }
}

}  // namespace dp
