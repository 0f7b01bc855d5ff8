// dp-worker's command line: its flags, their checks, and the WorkerOptions
// they give (docs/command-line.md).
#ifndef DP_WORKER_WORKER_FLAGS_H_
#define DP_WORKER_WORKER_FLAGS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/endpoint_flags.h"
#include "common/flags.h"
#include "proto/security.h"
#include "worker/worker.h"

namespace dp {

struct WorkerFlags {
  std::string ps = "localhost:5000";
  int shards = 0;
  int rank = -1;
  std::string data_dir;
  std::string backend = "auto";
  int device = -1;
  std::string cuda_module;
  EndpointFlags endpoints;
  int threads = 1;
  bool tf32 = false;
  std::string data_plane = "auto";
  std::string protocol = "fused";
  bool step_channel = true;
  int spin_us = 300;
  int wait_timeout_s = 30;
  int retry_for_s = 120;
  int stop_timeout_s = 20;
  SecurityFlags security;
  bool dry_run = false;  // set by ParseCommandLine
};

// Adds every flag of dp-worker but --dry_run (ParseCommandLine's).
void AddWorkerFlags(Flags* flags, WorkerFlags* f);

// The options the flags give, all but the security (main loads it after the
// dry run, which checks no files); INVALID_ARGUMENT naming the first flag
// out of its range (the checks `flags`, AddWorkerFlags', hold; then --ps).
absl::StatusOr<WorkerOptions> WorkerOptionsFromFlags(const Flags& flags,
                                                     const WorkerFlags& f);

}  // namespace dp

#endif  // DP_WORKER_WORKER_FLAGS_H_
