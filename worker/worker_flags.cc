// dp-worker's flags, their checks and the options they give.
#include "worker/worker_flags.h"

#include <algorithm>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/model_layout.h"
#include "common/shard_plan.h"
#include "common/status_macros.h"
#include "proto/grpc_server.h"
#include "worker/backend_choice.h"
#include "worker/ps_group.h"

namespace dp {
namespace {

// "host:port" with a port in 1..65535 ("[v6]:port" too).
bool IsHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  return colon != std::string::npos && colon > 0 &&
         absl::SimpleAtoi(address.substr(colon + 1), &port) && port >= 1 &&
         port <= 65535;
}

// -1 is no rank yet: dp-ps picks one.
absl::Status CheckRank(int rank) {
  if (rank < -1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--rank must be 0..N-1, or -1 for dp-ps to pick one (or DP_RANK, "
        "RANK, JOB_COMPLETION_INDEX), got %d",
        rank));
  }
  return absl::OkStatus();
}

}  // namespace

void AddWorkerFlags(Flags* flags, WorkerFlags* f) {
  flags->AddString("ps", &f->ps,
                   "dp-ps address host:port; a sharded job's shards as a "
                   "comma-separated list, or one name that resolves to all "
                   "of them; an entry with {shard} stands for one per shard "
                   "(--shards of them)");
  flags->AddInt("shards", &f->shards,
                "how many dp-ps shards an entry of --ps with {shard} names "
                "(0 = none has it)");
  flags
      ->AddInt("rank", &f->rank,
               "this worker's rank, 0..N-1 (-1: dp-ps picks one when it "
               "joins)",
               {"RANK", "JOB_COMPLETION_INDEX"})
      .Satisfies([f] { return CheckRank(f->rank); });
  flags->AddString(
      "data_dir", &f->data_dir,
      "directory of the data set's files: IDX, or train_x.npy, "
      "train_y.npy (and test_x.npy, test_y.npy) for dp-ps --dataset=npy "
      "(empty: the data set's default)");
  flags
      ->AddString("backend", &f->backend,
                  "auto | cpu | cuda (auto: cuda when the CUDA module is "
                  "installed and finds a GPU it has code for, else cpu)")
      // The name only: the manifests name the GPU backend, and their dry run
      // runs where there is no GPU.
      .Satisfies([f] { return CheckBackendName(f->backend); });
  flags->AddInt("device", &f->device,
                "CUDA device ordinal (-1: rank modulo the visible GPUs)",
                {"LOCAL_RANK"});
  flags->AddString("cuda_module", &f->cuda_module,
                   "path of libdp_cuda.so (empty: next to dp-worker, then "
                   "../lib/dp-ps/)");
  AddEndpointFlags(flags, &f->endpoints,
                   "port of the grpc.health.v1 service: SERVING once joined "
                   "(-1 = off, 0 = any free port)");
  flags->AddInt("threads", &f->threads, "BLAS threads of the CPU backend")
      .AtLeast(1);
  flags->AddBool("tf32", &f->tf32,
                 "CUDA backend: allow TF32 tensor-core matrix products (off: "
                 "exact float32)");
  flags
      ->AddString("data_plane", &f->data_plane,
                  "auto | grpc | shm: how the step's tensors travel (auto: "
                  "shared memory when dp-ps is on this host and offers it, "
                  "else gRPC; shm: that or an error)")
      .OneOf({"auto", "grpc", "shm"});
  flags
      ->AddString("protocol", &f->protocol,
                  "fused (PushPull, one round trip) | plain (Push, Barrier, "
                  "Pull)")
      .OneOf({"fused", "plain"});
  flags->AddBool("step_channel", &f->step_channel,
                 "with shared memory and --protocol=fused: each step's push "
                 "and wait through a page of shared memory instead of a "
                 "gRPC call");
  flags
      ->AddInt("spin_us", &f->spin_us,
               "a step channel wait looks for the answer this long before it "
               "sleeps, giving its core to any other runnable process "
               "meanwhile (0: sleeps at once)")
      .InRange(0, 10000);
  flags
      ->AddInt("wait_timeout_s", &f->wait_timeout_s,
               "deadline of one barrier wait; on expiry the worker says whom "
               "it waits for and waits again")
      .AtLeast(1);
  flags
      ->AddInt("retry_for_s", &f->retry_for_s,
               "how long to retry while dp-ps is unavailable")
      .AtLeast(0);
  flags
      ->AddInt("stop_timeout_s", &f->stop_timeout_s,
               "on SIGTERM the worker stops after its current step; if that "
               "takes longer than this, it exits anyway")
      .AtLeast(1);
  AddSecurityFlags(flags, &f->security, Side::kClient);
}

absl::StatusOr<WorkerOptions> WorkerOptionsFromFlags(const Flags& flags,
                                                     const WorkerFlags& f) {
  RETURN_IF_ERROR(flags.Validate());
  absl::StatusOr<std::vector<std::string>> entries =
      ExpandShardTemplate(f.ps, f.shards);
  if (!entries.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ps: ", entries.status().message()));
  }
  if (entries->empty() ||
      !std::all_of(entries->begin(), entries->end(), IsHostPort)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--ps must be host:port or a comma-separated list of "
                        "them, got '%s'",
                        f.ps));
  }
  WorkerOptions o;
  o.rank = f.rank;
  o.data_dir = f.data_dir;
  o.backend.name = f.backend;
  o.backend.device = f.device;
  o.backend.cuda_module = f.cuda_module;
  o.cpu_threads = f.threads;
  o.tf32 = f.tf32;
  o.fused = f.protocol == "fused";
  // The plain protocol's three calls stay calls, as --protocol=plain says.
  o.client.step_channel = f.step_channel && o.fused;
  o.client.step_spin.spin = absl::Microseconds(f.spin_us);
  o.client.data_plane = f.data_plane == "grpc"  ? DataPlane::kGrpc
                        : f.data_plane == "shm" ? DataPlane::kShm
                                                : DataPlane::kAuto;
  o.health_port = f.endpoints.health_port;
  o.metrics_port = f.endpoints.metrics_port;
  o.metrics_host = f.endpoints.metrics_host;
  o.client.address = f.ps;
  o.ps_addresses = ExpandPsAddresses(absl::StrJoin(*entries, ","));
  o.client.wait_timeout = absl::Seconds(f.wait_timeout_s);
  o.client.retry_for = absl::Seconds(f.retry_for_s);
  // The default model's; a registration to a job of a larger one widens it.
  o.client.max_message_bytes =
      MessageBytesFor(ModelLayout::SimpleNet().num_params());
  return o;
}

}  // namespace dp
