// The one place where absl::Status and grpc::Status meet: their codes map 1:1.
#ifndef DP_PROTO_GRPC_STATUS_H_
#define DP_PROTO_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace dp {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace dp

#endif  // DP_PROTO_GRPC_STATUS_H_
