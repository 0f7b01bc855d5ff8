// dp-ps's flags, their checks and the options they give.
#include "server/server_flags.h"

#include <unistd.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model_layout.h"
#include "common/safetensors.h"
#include "common/shard_plan.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "server/lr_schedule.h"

namespace dp {
namespace {

// The most micro-batches a step: --global_batch / --micro_batch.
constexpr int kMaxMicroBatches = 65536;

// Samples per micro-batch: --micro_batch, by default --batch_size.
int MicroBatch(const ServerFlags& f) {
  return f.micro_batch > 0 ? f.micro_batch : f.batch_size;
}

// Samples per step: --global_batch, by default --batch_size x --workers.
int64_t GlobalBatch(const ServerFlags& f) {
  return f.global_batch > 0 ? f.global_batch
                            : int64_t{f.batch_size} * f.workers;
}

// --shard, or the ordinal at the end of the host name (a StatefulSet's pod
// "dp-ps-2" is shard 2), or 0 for a job of one shard.
absl::StatusOr<int> ShardIndex(const ServerFlags& f) {
  if (f.shard >= 0 || f.shards <= 1) return std::max(f.shard, 0);
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  const absl::string_view name(host);
  const size_t dash = name.rfind('-');
  int ordinal = -1;
  if (dash == absl::string_view::npos ||
      !absl::SimpleAtoi(name.substr(dash + 1), &ordinal) || ordinal < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--shards=%d needs --shard (or DP_SHARD); the host name '%s' ends in "
        "no StatefulSet ordinal",
        f.shards, name));
  }
  return ordinal;
}

// The checks of the step's shape, which relate several flags.
// --save_model_every writes the whole model, which only one dp-ps holds
// while the job runs (shard 0 gathers the others' only at the end).
absl::Status ValidateModelSaves(const ServerFlags& f) {
  if (!f.export_checkpoint.empty() && f.save_model.empty()) {
    return absl::InvalidArgumentError(
        "--export_checkpoint needs --save_model: the file it writes");
  }
  if (f.save_model_every == 0) return absl::OkStatus();
  if (f.save_model.empty()) {
    return absl::InvalidArgumentError(
        "--save_model_every needs --save_model: the file it writes");
  }
  if (f.shards > 1) {
    return absl::InvalidArgumentError(
        "--save_model_every needs the whole model in one dp-ps; with "
        "--shards, each shard's --checkpoint_every checkpoints hold its part");
  }
  return absl::OkStatus();
}

absl::Status ValidateStep(const ServerFlags& f) {
  const int micro_batch = MicroBatch(f);
  const int64_t global_batch = GlobalBatch(f);
  if (f.global_batch < 0 || global_batch % micro_batch != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--global_batch must be a positive multiple of --micro_batch (%d), "
        "got %s",
        micro_batch,
        f.global_batch != 0
            ? absl::StrCat(f.global_batch)
            : absl::StrCat(global_batch, " (--batch_size x --workers)")));
  }
  const int64_t micro_batches = global_batch / micro_batch;
  if (micro_batches > kMaxMicroBatches) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--global_batch / --micro_batch must be at most %d micro-batches a "
        "step, got %d / %d = %d",
        kMaxMicroBatches, global_batch, micro_batch, micro_batches));
  }
  return CheckRanges({{"min_workers", f.min_workers, 1, f.workers, "--workers"},
                      {"backup_blocks", f.backup_blocks, 0, micro_batches,
                       "the micro-batches a step"}});
}

// "--flag: why", unless `value` names an encoding.
absl::Status CheckEncoding(const char* flag, const std::string& value) {
  if (auto e = ParseEncoding(value); !e.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": ", e.status().message()));
  }
  return absl::OkStatus();
}

// The job's model: --layers, else --init_model's tensors (an MLP's or any
// other model's), else SimpleNet. With both, the file must be an MLP's, of
// --layers' widths, which PsServer checks when it loads it.
absl::Status SetModel(const ServerFlags& f, JobConfig* config) {
  std::optional<ModelLayout> file;
  if (!f.init_model.empty()) {
    absl::StatusOr<ModelLayout> layout = LoadSafetensorsModel(f.init_model);
    if (!layout.ok()) {
      return absl::Status(
          layout.status().code(),
          absl::StrCat("--init_model: ", layout.status().message()));
    }
    file = *std::move(layout);
  }
  if (!f.layers.empty()) {
    if (file.has_value() && !file->is_mlp()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--layers=", f.layers, " and --init_model=", f.init_model,
          ": the file's model is not an MLP (", file->Describe(),
          "); drop --layers, the model is the file's"));
    }
    ASSIGN_OR_RETURN(config->layers, ParseMlpDims(f.layers, "--layers"));
  } else if (file.has_value() && file->is_mlp()) {
    config->layers = file->dims();
  } else if (file.has_value()) {
    config->layers.clear();
    for (const TensorInfo& t : file->tensors()) {
      config->tensors.push_back({t.name, t.shape});
    }
  }
  return absl::OkStatus();
}

// The optimiser's flags (docs/optimizer.md): torch.optim.Adam's or AdamW's
// hyper-parameters in torch's ranges, where eps must be > 0 so that a
// zero gradient cannot divide 0 by 0; the schedule; the clipping.
void AddOptimizerFlags(Flags* flags, ServerFlags* f) {
  flags
      ->AddString("optimizer", &f->optimizer,
                  "adam (torch.optim.Adam: --weight_decay adds wd x weight "
                  "to the gradient) | adamw (torch.optim.AdamW: the weights "
                  "shrink by lr x wd before the update)")
      .OneOf({"adam", "adamw"});
  flags->AddDouble("lr", &f->lr, "the learning rate (peak, when scheduled)")
      .Above(0.0);
  flags->AddDouble("beta1", &f->beta1, "decay of the gradient's average")
      .NotBelow(0.0)
      .Below(1.0);
  flags
      ->AddDouble("beta2", &f->beta2, "decay of the squared gradient's average")
      .NotBelow(0.0)
      .Below(1.0);
  flags->AddDouble("eps", &f->eps, "added to the update's denominator")
      .Above(0.0);
  flags
      ->AddDouble("weight_decay", &f->weight_decay,
                  "weight decay, L2 (adam) or decoupled (adamw)")
      .NotBelow(0.0)
      .NotAbove(1.0);
  flags
      ->AddString("lr_schedule", &f->lr_schedule,
                  "the rate of each update after the warm-up: constant | "
                  "cosine (from --lr down to --lr_min over the job's steps) "
                  "| step (x --lr_gamma every --lr_step_every steps)")
      .OneOf({"constant", "cosine", "step"});
  flags
      ->AddInt("warmup_steps", &f->warmup_steps,
               "the rate rises linearly over the first this many updates, "
               "update t at (t+1)/W of the schedule's (0 = no warm-up)")
      .AtLeast(0);
  flags
      ->AddDouble("lr_min", &f->lr_min,
                  "cosine: the rate the decay ends at (at most --lr)")
      .NotBelow(0.0);
  flags
      ->AddInt("lr_step_every", &f->lr_step_every,
               "step: updates between two decays of the rate (>= 1 for "
               "--lr_schedule=step)")
      .AtLeast(0);
  flags
      ->AddDouble("lr_gamma", &f->lr_gamma,
                  "step: the factor of each decay of the rate")
      .Above(0.0)
      .NotAbove(1.0);
  flags
      ->AddDouble("clip_grad_norm", &f->clip_grad_norm,
                  "scale each step's averaged gradient down to this global "
                  "L2 norm when it is larger, as "
                  "torch.nn.utils.clip_grad_norm_ (0 = off; one dp-ps "
                  "only: --shards=1)")
      .NotBelow(0.0);
}

// The checks that relate the optimiser's flags: the schedule's own
// settings, a decoupled decay factor 1 - lr x wd that stays >= 0, and a
// global norm that one dp-ps can see (a shard holds only its range).
absl::Status ValidateOptimizer(const ServerFlags& f) {
  if (f.lr_min > f.lr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--lr_min must be at most --lr (%g), got %g", f.lr, f.lr_min));
  }
  if (f.lr_schedule == "step" && f.lr_step_every < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--lr_step_every must be >= 1 for --lr_schedule=step, got ",
        f.lr_step_every));
  }
  if (f.optimizer == "adamw" && f.lr * f.weight_decay > 1.0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--optimizer=adamw needs --lr x --weight_decay <= 1 (the weights "
        "are scaled by 1 - lr x wd each step), got %g x %g",
        f.lr, f.weight_decay));
  }
  if (f.clip_grad_norm > 0 && f.shards > 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--clip_grad_norm needs the whole gradient in one dp-ps, got "
        "--shards=%d (each shard sees only its range)",
        f.shards));
  }
  return absl::OkStatus();
}

// The flags of the job itself: what a checkpoint pins and workers adopt.
// The model's files: where it starts from, where it goes, and the export
// of a checkpoint.
void AddModelFileFlags(Flags* flags, ServerFlags* f) {
  flags->AddString("init_model", &f->init_model,
                   "start from these weights (safetensors) instead of --seed");
  flags->AddString("save_model", &f->save_model,
                   "write the final weights here (safetensors); {step} in "
                   "the path stands for the weights' step");
  flags->AddString(
      "export_checkpoint", &f->export_checkpoint,
      "write the model in these checkpoint files (one dp-ps's, or one of "
      "each shard's, comma-separated) to --save_model and exit: no job");
  flags
      ->AddInt("save_model_every", &f->save_model_every,
               "also write the weights to --save_model every this many "
               "steps, atomically; {step} in --save_model names a file per "
               "step (0 = only the final weights; one dp-ps)")
      .AtLeast(0);
}

void AddJobFlags(Flags* flags, ServerFlags* f) {
  flags
      ->AddInt("workers", &f->workers,
               "the most workers at once (ranks 0..N-1)")
      .InRange(1, 1024);
  flags
      ->AddInt("batch_size", &f->batch_size,
               "batch size per worker: the default --micro_batch")
      .InRange(1, 65536);
  flags->AddInt("global_batch", &f->global_batch,
                "samples a step, a multiple of --micro_batch; the model "
                "depends on it, not on how many workers compute it (0 = "
                "--batch_size x --workers)");
  flags
      ->AddInt("micro_batch", &f->micro_batch,
               "samples a micro-batch, the unit of work handed to a worker "
               "(0 = --batch_size)")
      .InRange(0, 65536, "0 = --batch_size");
  flags->AddInt("min_workers", &f->min_workers,
                "steps wait while fewer workers are live (1..--workers)");
  flags->AddInt("epochs", &f->epochs, "epochs to train").AtLeast(1);
  AddOptimizerFlags(flags, f);
  flags->AddInt("seed", &f->seed, "seed of initialisation and data order");
  flags->AddBool("shuffle", &f->shuffle, "shuffle the data every epoch");
  flags
      ->AddString("dataset", &f->dataset,
                  "fashion-mnist | mnist | npy (the workers' --data_dir holds "
                  "train_x.npy, train_y.npy, optionally test_x.npy and "
                  "test_y.npy) | synthetic")
      .OneOf({"fashion-mnist", "mnist", "npy", "synthetic"});
  flags
      ->AddString("layers", &f->layers,
                  "the MLP's widths, inputs first, comma-separated: "
                  "IN,H1,...,OUT, ReLU between layers, tensors fc1.weight, "
                  "fc1.bias, ... (empty: --init_model's, else "
                  "784,256,128,10, SimpleNet)")
      .Satisfies([f] {
        return f->layers.empty() ? absl::OkStatus()
                                 : ParseMlpDims(f->layers, "--layers").status();
      });
  flags
      ->AddInt("max_steps", &f->max_steps,
               "stop after this many steps (0 = all epochs)")
      .AtLeast(0);
  AddModelFileFlags(flags, f);
  flags->AddInt("final_eval_timeout_s", &f->final_eval_timeout_s,
                "how long to wait for rank 0's final test accuracy; sharded, "
                "also how long shard 0 waits for a shard that does not answer "
                "while it collects the model, and how long another shard "
                "waits for shard 0 to collect its weights");
  flags
      ->AddString("grad_encoding", &f->grad_encoding,
                  "how workers send gradients: f32 | bf16 (half the bytes; "
                  "dp-ps averages in float32)")
      .Satisfies(
          [f] { return CheckEncoding("grad_encoding", f->grad_encoding); });
  flags
      ->AddString("weight_encoding", &f->weight_encoding,
                  "how dp-ps sends the weights: f32 | bf16 (half the bytes; "
                  "workers compute on rounded weights, dp-ps keeps and "
                  "updates them in float32)")
      .Satisfies(
          [f] { return CheckEncoding("weight_encoding", f->weight_encoding); });
  flags
      ->AddInt("update_threads", &f->update_threads,
               "threads for the average + Adam update (0 = one per 1Mi "
               "parameters: SimpleNet gets one; at most one per usable core "
               "(the cgroup's CPU limit counts) and 4; the result is the "
               "same for any number)")
      .InRange(0, 256);
}

void AddCheckpointFlags(Flags* flags, ServerFlags* f) {
  flags->AddString("checkpoint_dir", &f->checkpoint_dir,
                   "write checkpoints here and resume from the newest valid "
                   "one at start (empty = no checkpoints)");
  flags
      ->AddInt("checkpoint_every", &f->checkpoint_every,
               "steps between checkpoints (0 = only at shutdown and the end)")
      .AtLeast(0);
  flags
      ->AddInt("keep_checkpoints", &f->keep_checkpoints,
               "how many checkpoints to keep")
      .AtLeast(1);
  flags->AddBool("allow_hyperparameter_change", &f->allow_hyperparameter_change,
                 "resume from a checkpoint whose --lr, schedule, clipping, "
                 "betas, eps, weight decay or optimizer differ from these "
                 "flags (logged); without it such a resume is refused");
}

// What happens when workers leave, join or lag (docs/elastic.md).
void AddElasticFlags(Flags* flags, ServerFlags* f) {
  flags
      ->AddDouble("worker_timeout_s", &f->worker_timeout_s,
                  "a worker the step needs that has not called for this "
                  "long is reported missing")
      .Above(0.0);
  flags
      ->AddString("on_worker_loss", &f->on_worker_loss,
                  "reassign (a lost worker's micro-batches go to the others) "
                  "| wait (keep the step open until the rank comes back) | "
                  "fail (end the job with an error)")
      .OneOf({"reassign", "wait", "fail"});
  flags->AddInt("backup_blocks", &f->backup_blocks,
                "late blocks a step also handed to an idle worker; the first "
                "copy counts (0 = no straggler backups)");
  flags
      ->AddDouble("straggler_factor", &f->straggler_factor,
                  "a block is late once the step has run this many times as "
                  "long as the step's first push took (> 1)")
      .Above(1.0);
  flags
      ->AddInt("straggler_min_wait_ms", &f->straggler_min_wait_ms,
               "a block is never late sooner than this into the step")
      .AtLeast(0);
  flags
      ->AddDouble("start_wait_s", &f->start_wait_s,
                  "the first step waits this long, from the first "
                  "registration, for all --workers to register, then "
                  "starts with those there (at least --min_workers)")
      .NotBelow(0.0);
}

void AddShardFlags(Flags* flags, ServerFlags* f) {
  flags
      ->AddInt("shards", &f->shards,
               "how many dp-ps processes share the parameters; each owns a "
               "range of them (1 = this dp-ps holds all)")
      .InRange(1, kMaxShards);
  flags->AddInt("shard", &f->shard,
                "which of the --shards this dp-ps is (-1 = the ordinal at "
                "the end of the host name, as in a StatefulSet)");
  flags->AddString("shard_addresses", &f->shard_addresses,
                   "the shards' host:port, comma-separated (shard 0 collects "
                   "the model from them at the end; its own may be listed); "
                   "an entry with {shard} stands for one per shard");
}

}  // namespace

void AddServerFlags(Flags* flags, ServerFlags* f) {
  flags->AddString("host", &f->host, "address to listen on");
  flags->AddInt("port", &f->port, "gRPC port (0 picks a free one)")
      .InRange(0, 65535);
  AddEndpointFlags(flags, &f->endpoints,
                   "plaintext port serving only grpc.health.v1, for probes "
                   "that speak no TLS (-1 = off, 0 = any free port)");
  AddJobFlags(flags, f);
  AddCheckpointFlags(flags, f);
  AddElasticFlags(flags, f);
  flags->AddBool("shared_memory", &f->shared_memory,
                 "offer workers on this host (this network namespace) their "
                 "tensors through shared memory; gRPC stays the control "
                 "plane");
  flags
      ->AddInt("spin_us", &f->spin_us,
               "a step channel's thread looks for the next request this long "
               "before it sleeps, giving its core to any other runnable "
               "process meanwhile (0: sleeps at once; spinning helps only "
               "with a core to spare)")
      .InRange(0, 10000);
  AddShardFlags(flags, f);
  flags->AddBool("exit_when_done", &f->exit_when_done,
                 "exit once training is finished; false keeps serving the "
                 "final weights and status until SIGTERM (Kubernetes)");
  AddSecurityFlags(flags, &f->security, Side::kServer);
}

absl::Status ValidateServerFlags(const Flags& flags, const ServerFlags& f) {
  RETURN_IF_ERROR(flags.Validate());
  RETURN_IF_ERROR(ValidateStep(f));
  RETURN_IF_ERROR(ValidateModelSaves(f));
  RETURN_IF_ERROR(ValidateOptimizer(f));
  return CheckRanges(
      {{"shard", f.shard, -1, f.shards - 1, "-1 = from the host name"}});
}

absl::StatusOr<PsServerOptions> ServerOptionsFromFlags(const ServerFlags& f) {
  ASSIGN_OR_RETURN(const int shard, ShardIndex(f));
  absl::StatusOr<std::vector<std::string>> peers =
      ExpandShardTemplate(f.shard_addresses, f.shards);
  if (!peers.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shard_addresses: ", peers.status().message()));
  }
  RETURN_IF_ERROR(CheckShardAddresses(f.shards, shard, peers->size()));

  PsServerOptions o;
  o.host = f.host;
  o.port = f.port;
  o.health_port = f.endpoints.health_port;
  o.metrics_port = f.endpoints.metrics_port;
  o.metrics_host = f.endpoints.metrics_host;
  Schedule& schedule = o.config.schedule;
  schedule.world_size = f.workers;
  schedule.batch_size = MicroBatch(f);
  schedule.micro_batches = static_cast<int>(GlobalBatch(f) / MicroBatch(f));
  schedule.epochs = f.epochs;
  schedule.max_steps = f.max_steps;
  schedule.seed = static_cast<uint64_t>(f.seed);
  schedule.shuffle = f.shuffle;
  o.config.min_workers = f.min_workers;
  o.config.dataset = f.dataset;
  RETURN_IF_ERROR(SetModel(f, &o.config));
  AdamOptions& adam = o.config.adam;
  adam.lr = f.lr;
  adam.beta1 = f.beta1;
  adam.beta2 = f.beta2;
  adam.eps = f.eps;
  adam.weight_decay = f.weight_decay;
  adam.decoupled_weight_decay = f.optimizer == "adamw";
  adam.schedule.kind = *ParseLrSchedule(f.lr_schedule);
  adam.schedule.warmup_steps = f.warmup_steps;
  adam.schedule.lr_min = f.lr_min;
  adam.schedule.step_every = f.lr_step_every;
  adam.schedule.gamma = f.lr_gamma;
  adam.clip_grad_norm = f.clip_grad_norm;
  o.config.grad_encoding = *ParseEncoding(f.grad_encoding);
  o.config.weight_encoding = *ParseEncoding(f.weight_encoding);
  o.init_model = f.init_model;
  o.save_model = f.save_model;
  o.save_model_every = f.save_model_every;
  o.final_eval_timeout = absl::Seconds(f.final_eval_timeout_s);
  o.checkpoint_dir = f.checkpoint_dir;
  o.checkpoint_every = f.checkpoint_every;
  o.keep_checkpoints = f.keep_checkpoints;
  o.allow_hyperparameter_change = f.allow_hyperparameter_change;
  o.worker_timeout = absl::Seconds(f.worker_timeout_s);
  o.elastic.on_worker_loss = f.on_worker_loss == "fail" ? OnWorkerLoss::kFail
                             : f.on_worker_loss == "wait"
                                 ? OnWorkerLoss::kWait
                                 : OnWorkerLoss::kReassign;
  o.elastic.backup_blocks = f.backup_blocks;
  o.elastic.straggler_factor = f.straggler_factor;
  o.elastic.straggler_min_wait = absl::Milliseconds(f.straggler_min_wait_ms);
  o.elastic.start_wait = absl::Seconds(f.start_wait_s);
  o.update_threads = f.update_threads;
  o.exit_when_done = f.exit_when_done;
  o.shared_memory = f.shared_memory;
  o.step_spin.spin = absl::Microseconds(f.spin_us);
  o.shards = f.shards;
  o.shard = shard;
  o.gather.addresses = *std::move(peers);
  return o;
}

}  // namespace dp
