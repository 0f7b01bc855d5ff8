// dp-ps's command line: its flags, their checks, and the PsServerOptions
// they give (docs/command-line.md).
#ifndef DP_SERVER_SERVER_FLAGS_H_
#define DP_SERVER_SERVER_FLAGS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/endpoint_flags.h"
#include "common/flags.h"
#include "proto/security.h"
#include "server/ps_server.h"

namespace dp {

struct ServerFlags {
  std::string host = "0.0.0.0";
  int port = 5000;
  EndpointFlags endpoints;
  int workers = 2;
  int batch_size = 64;
  int64_t global_batch = 0;  // 0: batch_size x workers
  int micro_batch = 0;       // 0: batch_size
  int min_workers = 1;
  int epochs = 3;
  double lr = AdamOptions().lr;
  // The optimiser: torch.optim.Adam or AdamW, the rate's schedule and the
  // clipping of the gradient (defaults: AdamOptions', today's Adam).
  std::string optimizer = "adam";
  double beta1 = AdamOptions().beta1;
  double beta2 = AdamOptions().beta2;
  double eps = AdamOptions().eps;
  double weight_decay = AdamOptions().weight_decay;
  std::string lr_schedule = "constant";
  int64_t warmup_steps = LrSchedule().warmup_steps;
  double lr_min = LrSchedule().lr_min;
  int64_t lr_step_every = LrSchedule().step_every;
  double lr_gamma = LrSchedule().gamma;
  double clip_grad_norm = AdamOptions().clip_grad_norm;
  int64_t seed = 0;
  bool shuffle = true;
  std::string dataset = "fashion-mnist";
  std::string layers;  // empty: --init_model's, else SimpleNet's
  int64_t max_steps = 0;
  std::string init_model;
  std::string save_model;
  int save_model_every = 0;
  std::string export_checkpoint;  // comma-separated files
  int final_eval_timeout_s = 120;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 100;
  int keep_checkpoints = 3;
  bool allow_hyperparameter_change = false;
  double worker_timeout_s = 10;
  std::string on_worker_loss = "reassign";
  int backup_blocks = 1;
  double straggler_factor = 3.0;
  int straggler_min_wait_ms = 20;
  double start_wait_s = 30;
  std::string grad_encoding = "f32";
  std::string weight_encoding = "f32";
  int update_threads = 0;
  bool exit_when_done = true;
  bool shared_memory = true;
  int spin_us = 0;
  int shards = 1;
  int shard = -1;
  std::string shard_addresses;
  SecurityFlags security;
  bool dry_run = false;  // set by ParseCommandLine
};

// Adds every flag of dp-ps but --dry_run (ParseCommandLine's) to `flags`.
void AddServerFlags(Flags* flags, ServerFlags* f);

// INVALID_ARGUMENT naming the first flag out of its range, or OK: the
// checks `flags` (AddServerFlags') hold, then those that relate flags.
[[nodiscard]] absl::Status ValidateServerFlags(const Flags& flags,
                                               const ServerFlags& f);

// The options the flags give, all but the security (which starts gRPC's
// threads, so main loads it once the signal mask is set). INVALID_ARGUMENT
// for a shard that the flags and the host name do not name.
absl::StatusOr<PsServerOptions> ServerOptionsFromFlags(const ServerFlags& f);

}  // namespace dp

#endif  // DP_SERVER_SERVER_FLAGS_H_
