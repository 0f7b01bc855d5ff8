// absl::Status <-> grpc::Status.
#include "common/grpc_status.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace dp {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

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
