// The grpc.health.v1 contract of StartGrpcServer (what the Kubernetes probes
// rely on) and server reflection, in-process over real loopback gRPC.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "proto/grpc_server.h"
#include "gtest/gtest.h"
#include "server/ps_service.h"
#include "tests/health_client.h"
#include "tests/in_process_ps.h"

namespace dp {
namespace {

const std::string kPsService = dp::v1::ParameterServer::service_full_name();

class GrpcHealthTest : public ::testing::Test {
 protected:
  void Start(bool ready) {
    InProcessPsOptions options;
    options.world_size = 1;
    options.ready = ready;
    auto ps = InProcessPs::Start(options);
    ASSERT_TRUE(ps.ok()) << ps.status();
    ps_ = std::move(*ps);
    address_ = ps_->address();
  }

  std::unique_ptr<InProcessPs> ps_;
  std::string address_;
};

TEST_F(GrpcHealthTest, ReadyServerIsServingAndLive) {
  Start(/*ready=*/true);
  EXPECT_EQ(CheckHealth(address_, "").value_or(HealthStatus{}), kServing);
  EXPECT_EQ(CheckHealth(address_, kLivenessService).value_or(HealthStatus{}),
            kServing);
}

TEST_F(GrpcHealthTest, UnknownServiceIsNotFoundSoAProbeOnATypoFails) {
  Start(/*ready=*/true);
  auto status = CheckHealth(address_, "no.such.Service");
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(GrpcHealthTest, NotReadyServerIsNotServingButLive) {
  Start(/*ready=*/false);
  EXPECT_EQ(CheckHealth(address_, "").value_or(HealthStatus{}), kNotServing);
  EXPECT_EQ(CheckHealth(address_, kLivenessService).value_or(HealthStatus{}),
            kServing);
}

TEST_F(GrpcHealthTest, SetReadyFalseDrainsReadinessOfNamedServicesOnly) {
  Start(/*ready=*/true);
  SetReady(&ps_->server(), true, {kPsService});
  EXPECT_EQ(CheckHealth(address_, kPsService).value_or(HealthStatus{}),
            kServing);
  HealthWatcher watcher(address_, "");
  ASSERT_TRUE(watcher.WaitFor(kServing, absl::Seconds(10)));

  SetReady(&ps_->server(), false, {kPsService});
  // Watch delivers the change; Check agrees; liveness is untouched, so a
  // draining server is not restarted by its liveness probe.
  EXPECT_TRUE(watcher.WaitFor(kNotServing, absl::Seconds(10)));
  EXPECT_EQ(CheckHealth(address_, "").value_or(HealthStatus{}), kNotServing);
  EXPECT_EQ(CheckHealth(address_, kPsService).value_or(HealthStatus{}),
            kNotServing);
  EXPECT_EQ(CheckHealth(address_, kLivenessService).value_or(HealthStatus{}),
            kServing);
}

// Reflection: ServerReflectionInfo with list_services, over a generic stub
// (Debian ships the reflection server but not its client stubs). The reply
// names every service.
TEST_F(GrpcHealthTest, ReflectionListsTheParameterServerAndHealthServices) {
  Start(/*ready=*/true);
  auto channel =
      grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  auto call = stub.PrepareCall(
      &context,
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  // Each operation completes before the next starts: tag i, ok == true.
  auto await = [&cq](intptr_t tag) {
    void* got = nullptr;
    bool ok = false;
    EXPECT_TRUE(cq.Next(&got, &ok));
    EXPECT_EQ(reinterpret_cast<intptr_t>(got), tag);
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(await(1));
  // ServerReflectionRequest{list_services: ""}: field 7, length 0.
  const std::string request("\x3a\x00", 2);
  grpc::Slice slice(request);
  grpc::ByteBuffer out(&slice, 1);
  call->Write(out, reinterpret_cast<void*>(2));
  ASSERT_TRUE(await(2));
  call->WritesDone(reinterpret_cast<void*>(3));
  ASSERT_TRUE(await(3));
  grpc::ByteBuffer in;
  call->Read(&in, reinterpret_cast<void*>(4));
  ASSERT_TRUE(await(4));
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  await(5);
  EXPECT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(in.Dump(&slices).ok());
  std::string reply;
  for (const grpc::Slice& s : slices) {
    reply.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  EXPECT_NE(reply.find(kPsService), std::string::npos) << reply;
  EXPECT_NE(reply.find("grpc.health.v1.Health"), std::string::npos) << reply;
  EXPECT_NE(reply.find("grpc.reflection.v1alpha.ServerReflection"),
            std::string::npos)
      << reply;
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
}

}  // namespace
}  // namespace dp
