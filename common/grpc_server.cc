// gRPC server start-up and matching client channel arguments.
#include "common/grpc_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_format.h"

namespace dp {

absl::StatusOr<RunningServer> StartGrpcServer(
    const GrpcServerOptions& options,
    const std::vector<grpc::Service*>& services) {
  // Both are process-wide switches read by the builder; setting them again
  // is harmless.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  auto creds = options.credentials ? options.credentials
                                   : grpc::InsecureServerCredentials();
  builder.AddListeningPort(options.address, creds, &port);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  // Tensor messages are ~1 MB: a flow-control window that holds a whole
  // message avoids waiting for window updates mid-message.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
                             options.max_message_bytes);
  for (grpc::Service* s : services) builder.RegisterService(s);
  RunningServer running;
  running.server = builder.BuildAndStart();
  if (running.server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrFormat(
        "cannot listen on %s: the port is in use or the address is invalid",
        options.address));
  }
  running.port = port;
  running.server->GetHealthCheckService()->SetServingStatus(kLivenessService,
                                                            true);
  SetReady(running.server.get(), options.ready);
  return running;
}

void SetReady(grpc::Server* server, bool ready,
              const std::vector<std::string>& services) {
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  if (health == nullptr) return;
  health->SetServingStatus("", ready);
  for (const std::string& s : services) health->SetServingStatus(s, ready);
}

grpc::ChannelArguments ClientChannelArguments(int max_message_bytes) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(max_message_bytes);
  args.SetMaxSendMessageSize(max_message_bytes);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, max_message_bytes);
  return args;
}

int MessageBytesFor(int64_t num_floats) {
  return static_cast<int>(num_floats * 4 + (64 << 10));
}

}  // namespace dp
