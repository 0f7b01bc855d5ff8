// dp-ps inside the test process: a StepCoordinator behind a PsService, served
// by a real gRPC server on a loopback port, for tests that call it over the
// network without starting a process.
#ifndef DP_TESTS_IN_PROCESS_PS_H_
#define DP_TESTS_IN_PROCESS_PS_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/job_config.h"
#include "common/metrics.h"
#include "common/model_layout.h"
#include "proto/dp.grpc.pb.h"
#include "server/ps_service.h"
#include "server/server_metrics.h"
#include "server/shared_plane.h"
#include "server/step_coordinator.h"

namespace dp {

struct InProcessPsOptions {
  int world_size = 2;     // a synthetic job with batch 8; SimpleNet at seed 3
  int64_t max_steps = 0;  // 0: three epochs
  bool shared_memory = false;  // offer it to workers that ask
  Encoding weight_encoding = Encoding::kF32;
  // Records requests and update times here when not null.
  ServerMetrics* metrics = nullptr;
  bool ready = true;  // the readiness the health service starts with
  // The client's message limit; 0: the server's.
  int client_max_message_bytes = 0;
  // Shard `index` of `count` of the model (count 1: the whole vector). A
  // shard restores step 0 (Rollback), like dp-ps without checkpoints.
  int shard = 0;
  int shards = 1;
  // Run on a gRPC thread as each call arrives, before its handler, with the
  // method's full name ("/dp.v1.ParameterServer/Pull"): a test acts between
  // two calls of a worker. A request through a step channel, on its thread,
  // is named as its call with "step channel " before it.
  std::function<void(const std::string& method)> before_call;
};

class InProcessPs {
 public:
  static absl::StatusOr<std::unique_ptr<InProcessPs>> Start(
      const InProcessPsOptions& options = {});
  // Shuts the coordinator, then the server, down.
  ~InProcessPs();

  const ModelLayout& layout() const { return layout_; }
  StepCoordinator& coordinator() { return *coordinator_; }
  grpc::Server& server() { return *server_; }
  PsService& service() { return *service_; }
  const std::string& address() const { return address_; }
  dp::v1::ParameterServer::Stub& stub() { return *stub_; }
  // Null unless options.shared_memory.
  SharedPlane* shared_plane() { return shared_.get(); }

 private:
  InProcessPs() = default;

  const ModelLayout layout_ = ModelLayout::SimpleNet();
  std::unique_ptr<StepCoordinator> coordinator_;
  std::unique_ptr<SharedPlane> shared_;
  std::unique_ptr<PsService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::unique_ptr<dp::v1::ParameterServer::Stub> stub_;
  std::function<void(const std::string&)> before_call_;
};

}  // namespace dp

#endif  // DP_TESTS_IN_PROCESS_PS_H_
