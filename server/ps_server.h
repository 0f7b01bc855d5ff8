// dp-ps as an object: Start builds the job (a checkpoint to resume, or
// initial weights) and serves it (gRPC, the health port, metrics); Run
// drives it to its end (worker leases, progress, the loss policy, the final
// checkpoint, the saved model, the final evaluation); Stop drains it from
// any thread. Every part is a member, so nothing outlives what it uses, and
// tests drive a whole dp-ps in-process. main() only parses flags, maps
// results to exit codes and forwards signals to Stop.
#ifndef DP_SERVER_PS_SERVER_H_
#define DP_SERVER_PS_SERVER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/job_config.h"
#include "common/metrics.h"
#include "common/model_layout.h"
#include "common/step_channel.h"
#include "proto/health_server.h"
#include "proto/security.h"
#include "server/checkpoint.h"
#include "server/server_metrics.h"
#include "server/shard_gather.h"
#include "server/shared_plane.h"
#include "server/step_coordinator.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace dp {

// The update's threads when --update_threads is 0, for a coordinator of
// `values` parameters in a process that may use `usable_cpus` (its cgroup
// limit counts): one per kValuesPerUpdateThread values, at most one per CPU
// and kMaxUpdateThreads. Workers wait while the update runs, so its threads
// take no CPU from them; but the threads sleep between steps, and waking
// one costs more than it saves on a small model. On a 2-vCPU VM,
// SimpleNet's 235k values took 0.18 ms inside a job on 2 threads and 0.09
// ms on one, and the 2-worker job ran 25% slower (back-to-back updates
// alone are faster on 2, 0.063 vs 0.095 ms, which is not how a job calls
// them). Beyond 4 the update is bound by memory, not cores.
inline constexpr int64_t kValuesPerUpdateThread = int64_t{1} << 20;
inline constexpr int kMaxUpdateThreads = 4;
int DefaultUpdateThreads(int64_t values, int usable_cpus);

class PsService;
struct PsServiceOptions;

struct PsServerOptions {
  std::string host = "0.0.0.0";
  int port = 5000;       // 0 picks a free one
  int health_port = -1;  // plaintext grpc.health.v1 only; -1 off, 0 any
  int metrics_port = 0;  // kMetricsOff, kMetricsAnyPort or a port
  std::string metrics_host = "0.0.0.0";
  JobConfig config;
  std::string init_model;  // safetensors to start from instead of the seed
  std::string save_model;  // where the final weights go; empty: nowhere
  // Also every this many steps (0: only the final weights); one dp-ps.
  int64_t save_model_every = 0;
  absl::Duration final_eval_timeout = absl::Seconds(120);
  std::string checkpoint_dir;  // empty: no checkpoints
  int64_t checkpoint_every = 100;
  int keep_checkpoints = 3;
  // Resume from a checkpoint whose optimiser settings differ from config's
  // (logged); false refuses it (CheckResumable).
  bool allow_hyperparameter_change = false;
  absl::Duration worker_timeout = absl::Seconds(10);
  // How blocks follow the ranks: what a lost rank does to the job
  // (elastic.on_worker_loss), late blocks backed up.
  ElasticOptions elastic;
  int update_threads = 0;      // 0: DefaultUpdateThreads
  bool exit_when_done = true;  // false: serve until Stop()
  // Offer workers on this host (this network namespace) their tensors
  // through shared memory.
  bool shared_memory = true;
  // How a step channel's thread waits for the next request (the default:
  // it parks at once).
  ChannelSpin step_spin;
  ServerSecurity security;  // credentials default to plaintext
  // Sharded jobs: this dp-ps is shard `shard` of `shards` and owns that
  // range of the vector (common/shard_plan.h). Shard 0 speaks for the job:
  // at the end it collects the weights from every shard (gather.addresses)
  // and saves the model; the other shards exit once it has their final
  // weights.
  int shards = 1;
  int shard = 0;
  GatherOptions gather;
};

class PsServer {
 public:
  // A configuration error (a checkpoint of another job or that cannot be
  // used, an --init_model that does not load) keeps its code
  // (FAILED_PRECONDITION, INVALID_ARGUMENT, NOT_FOUND, DATA_LOSS...); a port
  // that cannot be served on is UNAVAILABLE.
  static absl::StatusOr<std::unique_ptr<PsServer>> Start(
      PsServerOptions options);
  // Stops serving, then lets its parts go, in that order.
  ~PsServer();

  PsServer(const PsServer&) = delete;
  PsServer& operator=(const PsServer&) = delete;

  enum class Outcome {
    kFinished,  // every step applied (and, if asked, the model saved)
    kStopped,   // Stop() before the end; the state is checkpointed
  };
  // Runs the job until it finishes, fails (the JobFailedError), or Stop()
  // is called; call once. Errors: the job failed, the final checkpoint of a
  // stop could not be written, or the model could not be saved.
  absl::StatusOr<Outcome> Run();
  // Drains from any thread, at any time before destruction (a signal
  // watcher): readiness off, steps refused with UNAVAILABLE, Run returns.
  void Stop(int signal);

  int port() const { return port_; }
  int health_port() const { return health_ ? health_->port() : 0; }
  int metrics_port() const {
    return metrics_endpoint_ ? metrics_endpoint_->port() : 0;
  }
  StepCoordinator& coordinator() { return *coordinator_; }

 private:
  explicit PsServer(PsServerOptions options);
  // Start's work, in the steps below.
  absl::Status Build();
  // Opens --checkpoint_dir (if set): the newest checkpoint, when this job
  // may resume from it; errors name the directory.
  absl::StatusOr<std::optional<Checkpoint>> OpenCheckpoints();
  // The coordinator at the resumed or initial state, its metrics, and the
  // checkpoint hook.
  absl::Status MakeCoordinator(std::optional<Checkpoint> resumed);
  // Shared memory for workers on this host; without it (logged) they use
  // gRPC.
  void StartSharedPlane();
  // What the service may call back: a shard's rollback and collection.
  PsServiceOptions ServiceOptions();
  absl::Status Serve();  // gRPC, health, metrics
  void SetReady(bool ready);
  // The final checkpoint: the last applied step (after Shutdown or Fail
  // nothing changes the state any more). OK without --checkpoint_dir.
  absl::Status FinalCheckpoint();
  // Worker leases (every 100 ms) and progress (every second) until the job
  // is done, fails or is stopped; the JobFailedError of a lost rank.
  absl::Status Watch();
  // The end of the job, or of this history when it is rolled back
  // meanwhile (OK then, and Run trains on): the final checkpoint, the model
  // (shard 0 collects and saves it; the other shards serve until it has
  // their part), the final evaluation, the summary. CANCELLED when stopped
  // while shard 0 collected the model.
  absl::Status Finish(absl::Time start);
  // Another shard: serves until shard 0 has collected its final weights of
  // this history and the workers are gone (ReleaseShards), or
  // --final_eval_timeout_s passes; returns early on a rollback or a stop.
  void AwaitCollection();
  // Shard 0: waits until `deadline` for every worker to go, then releases
  // the other shards.
  void AwaitWorkersGone(absl::Time deadline);
  // Shard 0 saw this shard's final weights of `step` (GetStatus collected).
  void NoteCollected(int64_t step);
  // --save_model_every: the weights after `step`, written over the last
  // (atomically), unless a newer step's are there.
  void SaveModelOf(int64_t step, const std::vector<float>& params);
  // The whole final vector to --save_model (if set). OK without saving when
  // a rollback cut the collection short; CANCELLED when a stop did.
  absl::Status SaveModel();
  void LogSummary(double seconds, bool have_eval) const;
  // The whole vector of the final weights: this dp-ps's, or (shard 0 of a
  // sharded job) every shard's.
  absl::StatusOr<std::vector<float>> FinalWeights();
  // The state of step 0 for this shard's range: from --init_model or the
  // seed, Adam's moments zero.
  absl::StatusOr<TrainingState> InitialState() const;
  bool sharded() const { return shard_.count > 1; }
  void ShutdownServers(absl::Duration grace);

  const PsServerOptions options_;
  const ModelLayout layout_;  // options_.config's layers or tensors
  ShardSpec shard_;
  // A shard other than 0: the generation (StepCoordinator: new at every
  // rollback) whose final weights shard 0 has collected. A rollback after a
  // collection makes a new end, which shard 0 collects again.
  absl::Mutex collection_mu_;
  // --save_model's writes, and the step of the newest one written.
  absl::Mutex model_mu_;
  int64_t model_saved_step_ ABSL_GUARDED_BY(model_mu_) = -1;
  std::optional<uint64_t> collected_generation_ ABSL_GUARDED_BY(collection_mu_);
  std::unique_ptr<CheckpointStore> store_;
  std::unique_ptr<ServerMetrics> metrics_;
  std::unique_ptr<StepCoordinator> coordinator_;
  std::unique_ptr<SharedPlane> shared_;
  std::unique_ptr<PsService> service_;
  // The servers read the parts above, so they are declared (and destroyed)
  // after them: ~PsServer stops them first.
  std::unique_ptr<MetricsEndpoint> metrics_endpoint_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HealthServer> health_;
  int port_ = 0;

  std::atomic<int> stop_signal_{0};
  absl::Notification stopped_;
};

}  // namespace dp

#endif  // DP_SERVER_PS_SERVER_H_
