// gRPC server start-up and matching client channel arguments.
#include "proto/grpc_server.h"

#include <grpc/grpc.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <openssl/crypto.h>
#include <sys/resource.h>

#include "absl/strings/str_format.h"

namespace dp {

// Never released: see the header.
void KeepGrpcForTheProcess() {
  // OpenSSL frees its tables in an atexit handler, while gRPC's threads live
  // on to the end: a reconnect that was loading a TLS key as main() returned
  // read freed memory (a refused worker exited with SIGSEGV, not its code).
  // Only the first initialisation decides, so this must precede grpc_init.
  OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, nullptr);
  grpc_init();
}

namespace {

// gRPC 1.51 stops accepting connections for good once accept() fails with
// EMFILE (grpc/grpc#20418), so a flood of connections that reaches the
// open-file limit even briefly would take the server down. The hard limit
// is usually far above the soft one (Debian: 524288 vs 1024).
void RaiseOpenFileLimit() {
  rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 &&
      limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

}  // namespace

absl::StatusOr<RunningServer> StartGrpcServer(
    const GrpcServerOptions& options,
    const std::vector<grpc::Service*>& services) {
  // Both are process-wide switches read by the builder; setting them again
  // is harmless.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  RaiseOpenFileLimit();
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
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             options.max_concurrent_streams);
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             options.handshake_timeout_ms);
  builder.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE,
                             options.max_metadata_bytes);
  const KeepaliveOptions& k = options.keepalive;
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, k.server_time_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, k.timeout_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
      k.min_recv_ping_interval_ms);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  if (options.interceptors) {
    builder.experimental().SetInterceptorCreators(options.interceptors());
  }
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

grpc::ChannelArguments ClientChannelArguments(int max_message_bytes,
                                              const KeepaliveOptions& k) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(max_message_bytes);
  args.SetMaxSendMessageSize(max_message_bytes);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, max_message_bytes);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, k.client_time_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, k.timeout_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Keep pinging through a long silent barrier wait (by default gRPC stops
  // after two pings without data).
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // A restarted dp-ps (or shard) listens again within a second or two;
  // gRPC's default reconnect backoff (1 s, growing to 120 s) kept its
  // workers away for seconds after that. The calls' own retries back off
  // too (ps_client.cc), so reconnecting stays cheap.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // A restarted dp-ps pod has a new address under the same name: look it
  // up again within a second, not after gRPC's default 30 s (the job does
  // not wait that long for a worker).
  args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, 1000);
  return args;
}

std::shared_ptr<grpc::Channel> ClientChannel(
    const std::string& address, int max_message_bytes,
    const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    const std::string& server_name) {
  grpc::ChannelArguments args = ClientChannelArguments(max_message_bytes);
  if (!server_name.empty()) args.SetSslTargetNameOverride(server_name);
  return grpc::CreateCustomChannel(
      address, credentials ? credentials : grpc::InsecureChannelCredentials(),
      args);
}

int MessageBytesFor(int64_t num_floats) {
  return static_cast<int>(num_floats * 4 + (64 << 10));
}

}  // namespace dp
