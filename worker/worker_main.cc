// dp-worker: parses flags, connects to dp-ps and trains until the job ends.
#include <cstdio>

#include "absl/strings/str_format.h"
#include "common/flags.h"
#include "common/grpc_server.h"
#include "common/log.h"
#include "common/model_layout.h"
#include "common/security.h"
#include "worker/ps_client.h"
#include "worker/trainer.h"

namespace dp {
namespace {

bool IsConfigurationError(const absl::Status& s) {
  return s.code() == absl::StatusCode::kInvalidArgument ||
         s.code() == absl::StatusCode::kFailedPrecondition ||
         s.code() == absl::StatusCode::kUnauthenticated ||
         s.code() == absl::StatusCode::kNotFound ||
         s.code() == absl::StatusCode::kDataLoss;
}

int Run(int argc, char** argv) {
  std::string ps = "localhost:5000";
  int rank = -1;
  std::string data_dir;
  std::string backend = "auto";
  int metrics_port = 0;
  int threads = 1;
  std::string protocol = "fused";
  int wait_timeout_s = 30;
  int retry_for_s = 120;
  Flags flags("dp-worker",
              "Worker of a dp-ps job: computes gradients on its data shard.");
  flags.AddString("ps", &ps, "dp-ps address host:port");
  flags.AddInt("rank", &rank, "this worker's rank, 0..N-1",
               {"RANK", "JOB_COMPLETION_INDEX"});
  flags.AddString("data_dir", &data_dir,
                  "directory of the IDX files (empty: the data set's default)");
  flags.AddString("backend", &backend, "auto | cpu | cuda");
  flags.AddInt("metrics_port", &metrics_port,
               "Prometheus metrics port (0 = off)");
  flags.AddInt("threads", &threads, "BLAS threads of the CPU backend");
  flags.AddString("protocol", &protocol,
                  "fused (PushPull, one round trip) | plain (Push, Barrier, "
                  "Pull)");
  flags.AddInt("wait_timeout_s", &wait_timeout_s,
               "deadline of one barrier wait; on expiry the worker says whom "
               "it waits for and waits again");
  flags.AddInt("retry_for_s", &retry_for_s,
               "how long to retry while dp-ps is unavailable");
  SecurityFlags security_flags;
  AddSecurityFlags(&flags, &security_flags, Side::kClient);
  auto action = flags.Parse(argc, argv);
  if (!action.ok()) {
    std::fprintf(stderr, "%s\n", std::string(action.status().message()).c_str());
    return kExitConfigError;
  }
  if (*action == Flags::Action::kExit) return kExitOk;
  SetLogTag(absl::StrFormat("worker %d", rank));
  if (rank < 0) {
    Log("configuration error: --rank is required (or DP_RANK, RANK, "
        "JOB_COMPLETION_INDEX)");
    return kExitConfigError;
  }
  if (protocol != "fused" && protocol != "plain") {
    Log("configuration error: --protocol must be fused or plain, got '%s'",
        protocol);
    return kExitConfigError;
  }
  if (threads < 1 || wait_timeout_s < 1 || retry_for_s < 0) {
    Log("configuration error: --threads and --wait_timeout_s must be >= 1, "
        "--retry_for_s >= 0");
    return kExitConfigError;
  }
  auto security = LoadClientSecurity(security_flags);
  if (!security.ok()) {
    Log("configuration error: %s", security.status().message());
    return kExitConfigError;
  }
  Log("dp-worker %s starting: %s", DP_VERSION, flags.Effective());
  Log("security: %s", security->Describe());

  PsClientOptions client_options;
  client_options.address = ps;
  client_options.wait_timeout = absl::Seconds(wait_timeout_s);
  client_options.retry_for = absl::Seconds(retry_for_s);
  client_options.max_message_bytes =
      MessageBytesFor(ModelLayout::SimpleNet().num_params());
  client_options.credentials = security->credentials;
  client_options.tls_server_name = security->server_name;
  client_options.auth_token = security->auth_token;
  PsClient client(client_options);
  TrainerOptions options;
  options.rank = rank;
  options.data_dir = data_dir;
  options.backend = backend;
  options.cpu_threads = threads;
  options.fused = protocol == "fused";
  Trainer trainer(&client, options);
  absl::Status s = trainer.Run();
  if (!s.ok()) {
    Log("error: %s", s.ToString());
    return IsConfigurationError(s) ? kExitConfigError : kExitFailure;
  }
  return kExitOk;
}

}  // namespace
}  // namespace dp

int main(int argc, char** argv) { return dp::Run(argc, argv); }
